"""One command from a model to a service that meets a traffic target: ``modelpress deploy``.

``deploy()`` (``api``) searches, protects, plans and writes a folder that platforms run
(``bundle``, ``platforms``, ``settings``), each file read back by its tool (``validate``), then
checks the plan against the real server (``overhead``: the server's own cost per request;
``load``: open-loop Poisson load; ``check``: measured p99 beside the promise). ``ray_app`` is
the builder Ray's ``serve run`` imports. The names load their module on first use (``serve``
reads a deploy folder's ``settings`` without the search and its graph tools).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "api": ["DeployResult", "deploy"],
        "check": ["TOLERANCE", "PlanCheck", "check_option"],
        "overhead": ["ServerCost", "calibrate"],
        "settings": ["ServeSettings", "is_folder", "read_folder"],
    },
)
