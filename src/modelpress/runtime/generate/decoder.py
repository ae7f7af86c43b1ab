"""One step of a decoder: token ids, mask, positions and the cache in; last logits and cache out.

``OrtDecoder`` runs the ONNX decoder of an LLM folder with the I/O contract of ``ir.llm``. With
``binding`` (the default) a step goes through ONNX Runtime's IO binding: the inputs are bound
from the numpy arrays where they lie and the outputs stay in the buffers ONNX Runtime allocated,
read back as numpy views (no copy of the cache on either side of a step). Without it a step is a
plain ``session.run`` (kept to measure the difference: ``benchmarks/bench_llm.py``). A prompt
of several tokens on a decoder with ``logits_to_keep`` (``ir.llm``) asks for its last position's
logits only: the LM head skips the others (a fifth of SmolLM2-135M's prefill time for 256 tokens),
and ONNX Runtime's arena gives back what such a run took (a long prompt's activations) when it
ends. Given ``present`` (arrays of the step's present shapes: the batch cache's spare buffers,
``kv_store.py``), a bound step writes the present keys and values there instead of into arrays
ONNX Runtime allocates (not an ``in_place`` step: it writes into its own past, below). With
``share`` (the default) a decoder of a left-aligned layout says ``shares_kv``: the engine then
passes the same buffers, of a capacity larger than the cache, as a step's past and present, and
the step writes only the new entries into them: the ``left_aligned``
layout's GroupQueryAttention (``convert --ops ort``) in its share-buffer mode (it compares the
pointers; the attention mask's width gives ``total_sequence_length``, and the present's length is
the larger of that and the buffers' capacity, so both bindings have the same shape), the
``in_place`` layout's ScatterND (the standard level) because its data and output are one
buffer. Such a step binds nothing: the cache, the logits, the token ids, the positions and a mask
as wide as the buffers stay bound while the buffers do, and a step copies its values in
(``_run_shared``). Any other step of an ``in_place`` decoder feeds new arrays: the cache, the
step's room and masked columns up to the ``kv_store.aligned`` width, which a bound step writes in
place.

Any callable with ``__call__``'s signature is a decoder: the scheduler's tests drive fake ones.
"""

from __future__ import annotations

import operator
import weakref

import numpy as np

from modelpress.errors import InputError
from modelpress.ir.llm import (
    ATTENTION_MASK,
    INPUT_IDS,
    LEFT_ALIGNED,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    DecoderConfig,
    past_feed,
    past_names,
    present_names,
)
from modelpress.runtime.generate.kv_store import aligned

_ONE = np.array(1, np.int64)
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class OrtDecoder:
    writes_present = True  # takes ``present=`` (``Engine``)

    def __init__(
        self, session, config: DecoderConfig, *, binding: bool = True, share: bool = True
    ) -> None:
        self.session = session
        self.config = config
        self.binding = binding
        self.shares_kv = binding and share and config.kv_layout in LEFT_ALIGNED
        names = {i.name for i in session.get_inputs()}
        self.past = [past_names(i) for i in range(config.num_layers)]
        self.present = [present_names(i) for i in range(config.num_layers)]
        wanted = {INPUT_IDS, ATTENTION_MASK, *(n for pair in self.past for n in pair)}
        missing = sorted(wanted - names)
        if missing:
            raise InputError(
                f"the decoder lacks the input(s) {', '.join(missing[:4])} of the LLM contract"
            )
        self.has_positions = POSITION_IDS in names
        overridable = {i.name for i in session.get_overridable_initializers()}
        self.last_only = LOGITS_TO_KEEP in names | overridable  # ``ir.llm``: the head on the last
        self.outputs = [LOGITS, *(n for pair in self.present for n in pair)]
        self.run_options = _shrinking_arena()
        self.logits_dtype = _DTYPES.get(
            next((o.type for o in session.get_outputs() if o.name == LOGITS), ""), np.float32
        )
        self._kept = None  # share mode: (the buffers, their IO binding), kept between steps

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        keys: list[np.ndarray],
        values: list[np.ndarray],
        present: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """``(logits of each row's last token [rows, vocab], present keys, present values)``;
        ``present``: where to write the present keys and values (bound steps only)."""
        feeds = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
        if self.has_positions:
            feeds[POSITION_IDS] = position_ids
        if (
            self.binding
            and present is not None
            and present[0] is keys
            and present[1] is values
            and input_ids.shape[1] == 1
        ):  # share mode: the cache stays bound from step to step
            return self._run_shared(feeds, keys, values)
        width = None
        if self.config.kv_layout == "in_place":  # the past comes with the step's room
            width = attention_mask.shape[1]
            keys, values, feeds[ATTENTION_MASK] = _with_room(keys, values, attention_mask)
            present = (keys, values) if self.binding else None  # written in place
        for (k_name, v_name), k, v in zip(self.past, keys, values):
            feeds[k_name], feeds[v_name] = k, v
        if self.last_only and input_ids.shape[1] > 1:
            # a prompt: the LM head on its last position only (``logits_to_keep``, an
            # overridable initializer, which IO binding cannot bind: a plain run)
            feeds[LOGITS_TO_KEEP] = _ONE
            outs = self.session.run(self.outputs, feeds, self.run_options)
        elif self.binding and present is not None:
            outs = self._run_into(feeds, *present)
        elif self.binding:
            outs = self._run_bound(feeds)
        else:
            outs = self.session.run(self.outputs, feeds)
        logits, keys, values = outs[0][:, -1, :], outs[1::2], outs[2::2]
        if width is not None:  # the step's columns, without the aligned width's masked rest
            keys, values = [a[:, :, :width] for a in keys], [a[:, :, :width] for a in values]
        return logits, keys, values

    def _run_bound(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        io = self.session.io_binding()
        for name, array in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in self.outputs:
            io.bind_output(name, "cpu")
        self.session.run_with_iobinding(io)
        return [v.numpy() for v in io.get_outputs()]

    def _run_shared(self, feeds: dict[str, np.ndarray], keys: list, values: list):
        """A step whose past and present are the same buffers (share mode). Their bindings are
        kept from step to step while the buffers stay the same objects, and so are those of the
        token ids, the positions and the mask: buffers of the decoder's, the step's values
        copied in, so a step binds nothing. The mask's buffer is as wide as the cache buffers
        (ones up to each row's length plus one, zeros after): GroupQueryAttention reads each
        row's length from it (``seqlens_k``) and needs its width (``total_sequence_length``) only
        to cover them; the logits and the cache come out bit for bit as with the step's own
        mask (tested). The logits returned are a view of the bound output buffer, not a copy:
        valid until the next step (``Engine`` chooses from them first)."""
        arrays = keys + values
        kept = self._kept
        if (
            kept is None
            or len(kept[0]) != len(arrays)
            or not all(map(operator.is_, arrays, [ref() for ref in kept[0]]))
        ):
            io = self.session.io_binding()
            names = zip(self.past + self.past, self.present + self.present)
            for i, ((past, present), array) in enumerate(zip(names, arrays)):
                side = int(i >= len(keys))  # keys then values: a pair's first then second name
                io.bind_input(past[side], "cpu", 0, array.dtype, array.shape, array.ctypes.data)
                io.bind_output(present[side], "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            rows = keys[0].shape[0] if keys else feeds[INPUT_IDS].shape[0]
            logits = np.empty((rows, 1, self.config.vocab_size), self.logits_dtype)
            io.bind_output(LOGITS, "cpu", 0, logits.dtype, logits.shape, logits.ctypes.data)
            steps = {n: np.zeros((rows, 1), np.int64) for n in (INPUT_IDS, POSITION_IDS)}
            steps[ATTENTION_MASK] = np.zeros((rows, keys[0].shape[2]), np.int64)
            for name, array in steps.items():
                if name in feeds:
                    io.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            # weak references: the binding must not keep a cache the engine let go of (a
            # binding whose arrays are gone is never run: new arrays are bound first)
            self._kept = kept = [[weakref.ref(a) for a in arrays], io, logits, steps, 0]
        _, io, logits, steps, width = kept
        steps[INPUT_IDS][...] = feeds[INPUT_IDS]
        if POSITION_IDS in feeds:
            steps[POSITION_IDS][...] = feeds[POSITION_IDS]
        mask = feeds[ATTENTION_MASK]
        steps[ATTENTION_MASK][:, : mask.shape[1]] = mask
        if mask.shape[1] < width:  # narrower than the last step's: no ones left past it
            steps[ATTENTION_MASK][:, mask.shape[1] : width] = 0
        kept[4] = mask.shape[1]
        self.session.run_with_iobinding(io)
        return logits[:, -1, :], keys, values

    def _run_into(self, feeds: dict[str, np.ndarray], keys: list, values: list):
        io = self.session.io_binding()
        for name, array in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(array))
        io.bind_output(LOGITS, "cpu")
        for (k_name, v_name), k, v in zip(self.present, keys, values):
            for name, array in ((k_name, k), (v_name, v)):
                io.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(io)
        return [io.get_outputs()[0].numpy(), *(a for pair in zip(keys, values) for a in pair)]


def _with_room(keys: list, values: list, mask: np.ndarray):
    """An ``in_place`` step's past and mask: the cache, then zero columns up to the ``aligned``
    width (the step's room and more; new arrays: a bound step writes its present into them)."""
    past = keys[0].shape[2] if keys else 0
    room = aligned(mask.shape[1]) - past
    keys = [past_feed("in_place", a, room) for a in keys]
    values = [past_feed("in_place", a, room) for a in values]
    return keys, values, np.pad(mask, ((0, 0), (0, past + room - mask.shape[1])))


def _shrinking_arena():
    """Run options that return the CPU arena's free memory to the system after the run."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options
