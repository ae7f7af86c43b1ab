"""Recurrent layers: LSTM, GRU and RNN, written out step by step so gradients reach W, R and B.

Gate order is ONNX's (LSTM ``iofc``, GRU ``zrh``), which differs from torch.nn.LSTM/GRU, so the
cells are computed here rather than handed to cuDNN. ``sequence_lens`` is honoured: past a
sequence's end its outputs are zero and its state stops changing; the reverse direction reads each
sequence backwards from its own last step. ``layout=1`` means batch-major input and outputs.
"""

from __future__ import annotations

import torch

from modelpress.runtime.torch_backend.registry import op


def _activation(name, alpha, beta):
    name = name.lower()
    table = {
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "relu": torch.relu,
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: torch.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: torch.where(x > alpha, x, torch.zeros_like(x)),
        "scaledtanh": lambda x: alpha * torch.tanh(beta * x),
        "hardsigmoid": lambda x: torch.clamp(alpha * x + beta, 0, 1),
        "elu": lambda x: torch.where(x >= 0, x, alpha * (torch.exp(x) - 1)),
        "softsign": lambda x: x / (1 + torch.abs(x)),
        "softplus": lambda x: torch.log1p(torch.exp(x)),
    }
    return table[name]


_DEFAULT_ALPHA = {
    "affine": 1.0,
    "leakyrelu": 0.01,
    "thresholdedrelu": 1.0,
    "scaledtanh": 1.0,
    "hardsigmoid": 0.2,
    "elu": 1.0,
}
_DEFAULT_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}


def _activations(ctx, defaults, num_dir):
    names = ctx.attr("activations") or defaults * num_dir
    alphas = list(ctx.attr("activation_alpha") or [])
    betas = list(ctx.attr("activation_beta") or [])
    fns = []
    for name in names:
        key = name.lower()
        alpha = alphas.pop(0) if key in _DEFAULT_ALPHA and alphas else _DEFAULT_ALPHA.get(key, 0.0)
        beta = betas.pop(0) if key in _DEFAULT_BETA and betas else _DEFAULT_BETA.get(key, 0.0)
        fns.append(_activation(name, alpha, beta))
    per = len(defaults)
    return [fns[d * per : (d + 1) * per] for d in range(num_dir)]


def _time_index(steps, lens, device):
    """Per (time, batch): the input step a reverse pass reads (backwards within each length)."""
    t = torch.arange(steps, device=device).reshape(-1, 1)
    return torch.where(t < lens, lens - 1 - t, t)


def _run(ctx, x, w, r, b, lens, init_states, cell, num_gates):
    """Shared driver: returns Y [seq, dir, batch, hidden] and final states per direction."""
    layout = ctx.attr("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        init_states = [s.transpose(0, 1) if s is not None else None for s in init_states]
    steps, batch = x.shape[0], x.shape[1]
    hidden = ctx.attr("hidden_size") or r.shape[-1]
    direction = ctx.attr("direction", "forward")
    num_dir = 2 if direction == "bidirectional" else 1
    clip = ctx.attr("clip")
    lens_row = None if lens is None else lens.to(torch.int64).reshape(1, -1).to(x.device)
    ys, finals = [], []
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        wd, rd = w[d], r[d]
        bd = (
            b[d]
            if b is not None
            else torch.zeros(2 * num_gates * hidden, dtype=x.dtype, device=x.device)
        )
        states = [
            s[d] if s is not None else torch.zeros(batch, hidden, dtype=x.dtype, device=x.device)
            for s in init_states
        ]
        src = _time_index(steps, lens_row, x.device) if reverse and lens_row is not None else None
        # the input projection of every step at once; the recurrence is sequential
        xw = torch.matmul(x, wd.t()) + bd[: num_gates * hidden] + bd[num_gates * hidden :]
        outs = []
        for t in range(steps):
            if reverse and lens_row is not None:
                xt = xw[src[t], torch.arange(batch, device=x.device)]
            else:
                xt = xw[steps - 1 - t if reverse else t]
            new_states = cell(ctx, d, xt, states, rd, bd, hidden, clip)
            if lens_row is not None:
                alive = (t < lens_row.reshape(-1)).reshape(-1, 1)
                new_states = [
                    torch.where(alive, n, o) for n, o in zip(new_states, states, strict=False)
                ]
                outs.append(torch.where(alive, new_states[0], torch.zeros_like(new_states[0])))
            else:
                outs.append(new_states[0])
            states = new_states
        y = torch.stack(outs)  # in processing order
        if reverse:
            if lens_row is None:
                y = y.flip(0)
            else:
                back = src.unsqueeze(-1).expand(steps, batch, hidden)
                y = torch.zeros_like(y).scatter(0, back, y)
        ys.append(y)
        finals.append(states)
    y = torch.stack(ys, dim=1)
    final = [torch.stack([f[i] for f in finals]) for i in range(len(finals[0]))]
    if layout:
        y = y.permute(2, 0, 1, 3)
        final = [f.transpose(0, 1) for f in final]
    return (y, *final)


def _clip(v, clip):
    return v if clip is None else torch.clamp(v, -clip, clip)


@op("LSTM")
def lstm(ctx, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    num_dir = w.shape[0]
    acts = _activations(ctx, ["Sigmoid", "Tanh", "Tanh"], num_dir)
    couple = ctx.attr("input_forget", 0)

    def cell(ctx, d, xt, states, rd, bd, hidden, clip):
        h, c = states
        gates = xt + h @ rd.t()
        gi, go, gf, gc = gates.split(hidden, dim=-1)
        f, g, hh = acts[d]
        if p is not None:
            pi, po, pf = p[d].split(hidden)
            gi, gf = gi + pi * c, gf + pf * c
        i = f(_clip(gi, clip))
        fg = 1 - i if couple else f(_clip(gf, clip))
        c_new = fg * c + i * g(_clip(gc, clip))
        if p is not None:
            go = go + po * c_new
        o = f(_clip(go, clip))
        return [o * hh(c_new), c_new]

    return _run(ctx, x, w, r, b, lens, [h0, c0], cell, 4)


@op("GRU")
def gru(ctx, x, w, r, b=None, lens=None, h0=None):
    num_dir = w.shape[0]
    acts = _activations(ctx, ["Sigmoid", "Tanh"], num_dir)
    before = ctx.attr("linear_before_reset", 0)

    def cell(ctx, d, xt, states, rd, bd, hidden, clip):
        (h,) = states
        f, g = acts[d]
        rz, rr, rh = rd.split(hidden, dim=0)
        rbh = bd[5 * hidden :]
        # xt already holds Wb + Rb for every gate; the h-gate's Rb must move inside r * (...)
        xz, xr, xh = xt.split(hidden, dim=-1)
        z = f(_clip(xz + h @ rz.t(), clip))
        rg = f(_clip(xr + h @ rr.t(), clip))
        if before:
            hcand = g(_clip(xh - rbh + rg * (h @ rh.t() + rbh), clip))
        else:
            hcand = g(_clip(xh + (rg * h) @ rh.t(), clip))
        return [(1 - z) * hcand + z * h]

    return _run(ctx, x, w, r, b, lens, [h0], cell, 3)


@op("RNN")
def rnn(ctx, x, w, r, b=None, lens=None, h0=None):
    num_dir = w.shape[0]
    acts = _activations(ctx, ["Tanh"], num_dir)

    def cell(ctx, d, xt, states, rd, bd, hidden, clip):
        (h,) = states
        return [acts[d][0](_clip(xt + h @ rd.t(), clip))]

    return _run(ctx, x, w, r, b, lens, [h0], cell, 1)
