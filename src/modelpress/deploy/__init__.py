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

_LAZY = {
    "DeployResult": "modelpress.deploy.api",
    "deploy": "modelpress.deploy.api",
    "TOLERANCE": "modelpress.deploy.check",
    "PlanCheck": "modelpress.deploy.check",
    "check_option": "modelpress.deploy.check",
    "ServerCost": "modelpress.deploy.overhead",
    "calibrate": "modelpress.deploy.overhead",
    "ServeSettings": "modelpress.deploy.settings",
    "is_folder": "modelpress.deploy.settings",
    "read_folder": "modelpress.deploy.settings",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
