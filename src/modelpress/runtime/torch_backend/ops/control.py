"""Control flow: If, Loop and Scan run their compiled subgraphs with the enclosing values in scope.

The condition of If and the trip count and condition of Loop are read back as Python values, so
``torch.compile`` breaks its graph at these nodes (the result is still correct). Scan needs opset 9
or newer (opset 8's Scan had a batch axis and sequence lengths).
"""

from __future__ import annotations

import torch

from modelpress.runtime.torch_backend.registry import op


@op("If", scoped=True)
def if_(ctx, env, module, cond):
    branch = ctx.subgraphs["then_branch" if bool(ctx.scalar(0, cond)) else "else_branch"]
    return tuple(branch.run(module, {}, env))


@op("Loop", scoped=True)
def loop(ctx, env, module, trip_count=None, cond=None, *carried):
    body = ctx.subgraphs["body"]
    max_trip = None if trip_count is None else int(ctx.scalar(0, trip_count))
    keep = True if cond is None else bool(ctx.scalar(1, cond))
    carried = list(carried)
    n = len(carried)
    device = next(
        (t.device for t in [trip_count, cond, *carried] if isinstance(t, torch.Tensor)),
        torch.device("cpu"),
    )
    scans: list[list[torch.Tensor]] = [[] for _ in range(len(body.outputs) - 1 - n)]
    i = 0
    while keep and (max_trip is None or i < max_trip):
        feeds = dict(
            zip(
                body.inputs,
                [
                    torch.tensor(i, dtype=torch.int64, device=device),
                    torch.tensor(keep, dtype=torch.bool, device=device),
                    *carried,
                ],
                strict=False,
            )
        )
        outs = body.run(module, feeds, env)
        keep = bool(outs[0].reshape(-1)[0].item())
        carried = list(outs[1 : 1 + n])
        for j, s in enumerate(outs[1 + n :]):
            scans[j].append(s)
        i += 1
    stacked = [torch.stack(s) if s else torch.zeros(0, device=device) for s in scans]
    return tuple(carried + stacked)


@op("Scan", scoped=True, since=9)
def scan(ctx, env, module, *args):
    body = ctx.subgraphs["body"]
    m = ctx.attr("num_scan_inputs")
    states = list(args[: len(args) - m])
    inputs = args[len(args) - m :]
    n = len(states)
    in_axes = ctx.attr("scan_input_axes") or [0] * m
    in_dirs = ctx.attr("scan_input_directions") or [0] * m
    k = len(body.outputs) - n
    out_axes = ctx.attr("scan_output_axes") or [0] * k
    out_dirs = ctx.attr("scan_output_directions") or [0] * k
    in_axes = [a + inputs[j].dim() if a < 0 else a for j, a in enumerate(in_axes)]
    steps = inputs[0].shape[in_axes[0]]
    scans: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for t in range(steps):
        slices = [
            x.select(a, steps - 1 - t if d else t)
            for x, a, d in zip(inputs, in_axes, in_dirs, strict=False)
        ]
        outs = body.run(module, dict(zip(body.inputs, states + slices, strict=False)), env)
        states = list(outs[:n])
        for j, s in enumerate(outs[n:]):
            scans[j].append(s)
    results = []
    for s, a, d in zip(scans, out_axes, out_dirs, strict=False):
        if d:
            s = s[::-1]
        y = torch.stack(s)
        a = a + y.dim() if a < 0 else a
        results.append(y.movedim(0, a))
    return tuple(states + results)
