"""How units flow through each op: the rules of the dependency analysis (see ``depgraph.py``).

A rule reads its node's inputs' tracks and concrete shapes, gives its outputs tracks, joins units
that must be removed together, and records the constant entries (``Slice``) and shape constants
(``Edit``) each unit owns. A rule that cannot follow its input raises ``Refuse``: every unit of its
tracked inputs is then blocked (kept), which is always safe. Ops without a rule block too.

The rules register themselves (``registry.rule``) by kind of op: ``layers`` (the weights that own
units), ``pointwise`` (ops that keep the layout) and ``shapes`` (ops that move or reshape data).
"""

from modelpress.compress.prune.rules import layers, pointwise, shapes  # noqa: F401  (register)
from modelpress.compress.prune.rules.shapes import regroup, target_site

__all__ = ["regroup", "target_site"]
