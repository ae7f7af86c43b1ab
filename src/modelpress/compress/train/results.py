"""What the results of the methods that train (pruning, distillation, Deep Compression) write in
their records: one ``to_dict`` for all of them."""

from __future__ import annotations

from dataclasses import fields


def result_dict(result, *, skip: tuple[str, ...] = ("model",)) -> dict:
    """``result``'s dataclass fields but ``skip``: a nested result (the training curves, the check
    on held-out samples) by its own ``to_dict``, tuples as lists, the seconds to the millisecond."""

    def plain(value):
        if hasattr(value, "to_dict"):
            return value.to_dict()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    out = {f.name: plain(getattr(result, f.name)) for f in fields(result) if f.name not in skip}
    out["seconds"] = round(result.seconds, 3)
    return out
