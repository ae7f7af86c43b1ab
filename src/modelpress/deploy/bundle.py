"""Write a deploy folder, whole or not at all.

The folder is built in a staging folder beside ``DEPLOY_DIR``, every file is read back by the
tool that reads it (``validate.check_folder``), and only then does it replace ``DEPLOY_DIR``
(renamed into place; an older deploy folder there is removed after). A folder that is not a
deploy folder (no ``serve.yaml``) and not empty is never replaced.

Layout::

    DEPLOY_DIR/
      model.onnx | model.mpk      the chosen model (a package when a key was given)
      processing.json             the pre/post-processing the model declares (when it does)
      recipe.yaml                 the steps that rebuild the model from the original
      serve.yaml                  modelpress serve DEPLOY_DIR
      ray-serve.yaml              serve run DEPLOY_DIR/ray-serve.yaml
      kserve.yaml                 kubectl apply -f DEPLOY_DIR/kserve.yaml
      triton/NAME/config.pbtxt    tritonserver --model-repository DEPLOY_DIR/triton
      triton/NAME/1/model.onnx    (not for a protected model: Triton cannot open a package)
      Dockerfile, .dockerignore   docker build DEPLOY_DIR
      records/                    the record of every step (modelpress report DEPLOY_DIR/records)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx_ir as ir

from modelpress.deploy import platforms
from modelpress.deploy.settings import SERVE_FILE, ServeSettings
from modelpress.deploy.validate import Check, check_folder
from modelpress.errors import ModelSaveError, OptionError
from modelpress.ir import save
from modelpress.ir.files import output_dir, write_bytes
from modelpress.runtime.processing import Processing
from modelpress.search.recipe import Recipe

RECORDS = "records"


class BundleError(ModelSaveError):
    """A file of the bundle did not load in the tool that reads it."""


@contextmanager
def staged(output: str | Path) -> Iterator[Path]:
    """A staging folder that replaces ``output`` when the block ends without an error."""
    out = Path(output)
    parent = output_dir(out)
    if out.exists() and not out.is_dir():
        raise OptionError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / SERVE_FILE).is_file():
        raise OptionError(
            f"{out}: a folder that is not a deploy folder (no {SERVE_FILE}): give an empty or new one"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # (mkdtemp makes it private; the folder is for sharing)
    try:
        yield tmp
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bundle(
    folder: Path,
    *,
    model: ir.Model,
    settings: ServeSettings,
    final: Path,
    recipe: Recipe | None,
    package: Callable[[Path], None] | None = None,
    image: str | None = None,
) -> list[Check]:
    """Write every file of the layout into ``folder`` (the staging folder of ``final``), then
    check them; ``package(path)`` writes the protected model (``settings.protected``)."""
    model_path = folder / settings.model
    if settings.protected:
        if package is None:
            raise OptionError("a protected bundle needs the package writer")
        package(model_path)
    else:
        save(model, model_path)
    processing = Processing.from_model(model)
    if processing is not None:
        write_bytes(folder / "processing.json", json.dumps(processing.to_dict(), indent=2).encode())
    if recipe is not None:
        recipe.write(folder / "recipe.yaml")
    settings.write(folder)
    yaml = __import__("yaml")
    absolute = str(Path(final).resolve())
    _yaml_file(
        folder / platforms.RAY_FILE,
        platforms.ray_config(settings, absolute),
        yaml,
        "# serve run THIS_FILE  (Ray's CLI; args.folder is this folder: edit it if you move it)\n",
    )
    image = image or f"{platforms.dns_name(settings.name)}:latest"
    _yaml_file(
        folder / platforms.KSERVE_FILE,
        platforms.kserve_manifest(settings, image=image),
        yaml,
        f"# kubectl apply -f THIS_FILE  (after: docker build -t {image} THIS_FOLDER, pushed where the cluster pulls)\n",
    )
    if not settings.protected:
        repo = folder / platforms.TRITON_DIR / settings.name
        (repo / "1").mkdir(parents=True)
        shutil.copyfile(model_path, repo / "1" / "model.onnx")
        write_bytes(repo / "config.pbtxt", platforms.triton_config(settings, model).encode())
    write_bytes(folder / platforms.DOCKER_FILE, platforms.dockerfile(settings).encode())
    write_bytes(folder / ".dockerignore", b"triton/\nrecords/\n")
    (folder / RECORDS).mkdir(exist_ok=True)
    checks = check_folder(folder)
    bad = [c for c in checks if c.status == "failed"]
    if bad:
        raise BundleError(f"{final}: {bad[0].file} does not load in {bad[0].tool}: {bad[0].detail}")
    return checks


def _yaml_file(path: Path, data: dict, yaml, head: str) -> None:
    write_bytes(path, (head + yaml.safe_dump(data, sort_keys=False)).encode())


__all__ = ["RECORDS", "BundleError", "staged", "write_bundle"]
