"""Search: from a model to its best deployable version within an accuracy budget.

``auto()`` searches a space read from the registries (``space``), one trial a candidate
(``trial``), cached on disk (``cache``), and keeps the Pareto front (``pareto``); the winner's
steps are a ``Recipe`` (YAML) that ``run_recipe`` replays.
"""

from modelpress.search.engine import auto
from modelpress.search.recipe import Recipe, RecipeError, load_recipe, parse_recipe, run_recipe
from modelpress.search.result import AutoResult, SearchEvent
from modelpress.search.space import Candidate, Step, build_space
from modelpress.search.steps import STEPS, register_step
from modelpress.search.trial import Trial

__all__ = [
    "STEPS",
    "AutoResult",
    "Candidate",
    "Recipe",
    "RecipeError",
    "SearchEvent",
    "Step",
    "Trial",
    "auto",
    "build_space",
    "load_recipe",
    "parse_recipe",
    "register_step",
    "run_recipe",
]
