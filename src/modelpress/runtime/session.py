"""``Session``: run a model on a backend and a device, with placement, fallback and a log.

    sess = modelpress.Session("model.onnx", backend="ort", device="auto")
    outputs = sess.run({"input": x})

With no pins the whole graph runs on one device as one backend session. With pins the graph is cut
into per-device segments (``placement.plan``) that run in order, tensors passing between them
(each such hand-over is a counted copy). Inputs are checked first: a missing input, a wrong dtype or
rank gives one ``InputError`` naming the input.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.feeds import as_model, check_feeds
from modelpress.ir.shapes import infer_shapes
from modelpress.runtime.backend import Backend, get_backend
from modelpress.runtime.cpu import TARGET_METADATA_KEY, target_warning
from modelpress.runtime.placement import PlacementPlan, parse_pins, plan, segment_model


class Session:
    def __init__(
        self,
        model,
        *,
        backend: str | Backend = "ort",
        device: str = "auto",
        place: list[str] | None = None,
        strict: bool = False,
    ):
        self.model: ir.Model = as_model(model)
        self.backend: Backend = get_backend(backend) if isinstance(backend, str) else backend
        pins = parse_pins(place)
        self.plan: PlacementPlan = plan(
            self.model,
            device=device,
            available=self.backend.devices(),
            pins=pins,
            strict=strict,
            backend=self.backend.name,
        )
        if len(self.plan.segments) <= 1:
            dev = self.plan.segments[0].device if self.plan.segments else "cpu"
            self._parts = [(None, self.backend.prepare(self.model, device=dev))]
        else:
            # Segment boundaries become graph inputs, which need types: take them from inference.
            shaped = infer_shapes(self.model)
            self._parts = [
                (seg, self.backend.prepare(segment_model(shaped, seg), device=seg.device))
                for seg in self.plan.segments
            ]
        # (read only for models that carry the key: the capability probe runs a session once)
        self._notes = []
        if TARGET_METADATA_KEY in self.model.metadata_props:
            warning = target_warning(dict(self.model.metadata_props))
            self._notes = [warning] if warning else []
        self.input_names = [
            v.name for v in self.model.graph.inputs if v.name not in self.model.graph.initializers
        ]
        self.output_names = [v.name for v in self.model.graph.outputs]
        self.copied_bytes = 0

    @property
    def warnings(self) -> list[str]:
        return self.plan.warnings + self._notes

    @property
    def device(self) -> str:
        return ",".join(self.plan.devices) or "cpu"

    def run(self, feeds: dict[str, np.ndarray], *, check: bool = True) -> dict[str, np.ndarray]:
        """Outputs by name for one set of inputs."""
        if check:
            check_feeds(self.model, feeds)
        if self._parts[0][0] is None:
            return self._parts[0][1].run(feeds)
        values = dict(feeds)
        where = {name: "cpu" for name in feeds}
        for seg, prepared in self._parts:
            seg_feeds = {}
            for name in seg.inputs:
                if where.get(name) != seg.device:
                    self.copied_bytes += values[name].nbytes
                seg_feeds[name] = values[name]
            out = prepared.run(seg_feeds)
            values.update(out)
            where.update({name: seg.device for name in out})
        for name in self.output_names:  # outputs return to the host
            if where.get(name, "cpu") != "cpu":
                self.copied_bytes += values[name].nbytes
        return {name: values[name] for name in self.output_names}
