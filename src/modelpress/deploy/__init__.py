"""One command from a model to a service that meets a traffic target: ``modelpress deploy``.

``deploy()`` (``api``) searches, protects, plans and writes a folder that platforms run
(``bundle``, ``platforms``, ``settings``), each file read back by its tool (``validate``), then
checks the plan against the real server (``overhead``: the server's own cost per request;
``load``: open-loop Poisson load; ``check``: measured p99 beside the promise). ``ray_app`` is
the builder Ray's ``serve run`` imports.
"""

from modelpress.deploy.api import DeployResult, deploy
from modelpress.deploy.check import TOLERANCE, PlanCheck, check_option
from modelpress.deploy.overhead import ServerCost, calibrate
from modelpress.deploy.settings import ServeSettings, is_folder, read_folder

__all__ = [
    "TOLERANCE",
    "DeployResult",
    "PlanCheck",
    "ServeSettings",
    "ServerCost",
    "calibrate",
    "check_option",
    "deploy",
    "is_folder",
    "read_folder",
]
