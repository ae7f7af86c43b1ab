"""The application builder that ``serve run DEPLOY_DIR/ray-serve.yaml`` imports.

Ray's config names ``import_path: modelpress.deploy.ray_app:build`` and ``args: {folder: ...}``;
Ray calls ``build(args)`` and runs the application it returns (the app of ``serve.ray_serve``:
the same routes, checks and batcher as ``modelpress serve``), with the replicas and autoscaling
bounds of the config's ``deployments:`` entry. A protected model's key comes from the
environment variable ``MODELPRESS_KEY`` (hex) of the process that builds the app.
"""

from __future__ import annotations

from pathlib import Path

from modelpress.deploy.platforms import KEY_ENV
from modelpress.deploy.settings import read_folder
from modelpress.errors import InputError
from modelpress.ir import load
from modelpress.protect import load_key, open_package
from modelpress.serve.ray_serve import ModelSource, application


def build(args: dict):
    """The Ray Serve application of the deploy folder ``args['folder']``."""
    folder = args.get("folder") if isinstance(args, dict) else None
    if not folder:
        raise InputError("ray-serve.yaml: the application's args need 'folder' (the deploy folder)")
    settings, model_path = read_folder(Path(folder).expanduser())
    if settings.protected:
        model = open_package(model_path, load_key(key_env=KEY_ENV))
    else:
        model = load(model_path)
    device = "cuda" if settings.device.startswith("cuda") else "cpu"
    return application(
        [ModelSource(settings.name, model)], settings.options(), replicas=None, device=device
    )


__all__ = ["build"]
