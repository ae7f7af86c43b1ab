"""How a command that trains (prune, distill, compress, quantize --mode qat) trains, on what
data, and what the result must keep of the original (its budget)."""

from __future__ import annotations

import argparse

from modelpress.cli.options.command import add_switch, add_with_default
from modelpress.cli.options.data import add_data
from modelpress.compress.prune.unstructured import SCOPES


def add_training_data(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--data`` as the commands that train read it (with labels, a batch size and a limit)."""
    add_data(
        p,
        required=required,
        help="training data: an .npz of arrays named after the model's inputs, or a folder of images in class subfolders",
        labels=True,
        batch=True,
        limit=True,
    )


def add_training(
    p: argparse.ArgumentParser,
    *,
    teacher: bool = True,
    epochs: int = 2,
    temperature: float = 1.0,
    no_train: bool = True,
    budget: bool = True,
) -> None:
    """How a command that trains (prune, distill, compress, quantize --mode qat) trains; the help
    shows the defaults the command uses (``--steps`` wins over ``--epochs``). With ``budget``, what
    the result must keep of the original (``add_budget``)."""
    g = p.add_argument_group("training")
    add_with_default(
        g, "--epochs", type=int, default=epochs, metavar="N", help="passes over the training data"
    )
    g.add_argument("--steps", type=int, metavar="N", help="optimizer steps (instead of epochs)")
    g.add_argument("--lr", type=float, metavar="X", help="learning rate (default 3e-3; qat 1e-4)")
    g.add_argument(
        "--optimizer", default="adam", choices=["adam", "adamw", "sgd"], help="default adam"
    )
    add_with_default(
        g,
        "--schedule",
        default="cosine",
        choices=["cosine", "linear", "constant"],
        help="learning-rate schedule after warm-up",
    )
    add_with_default(
        g,
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="X",
        help="samples held out for early stopping and the check",
    )
    g.add_argument(
        "--patience",
        type=int,
        metavar="N",
        help="stop after N held-out evaluations without improvement (default 5; 10 a run)",
    )
    add_with_default(g, "--seed", type=int, default=0, help="shuffling and split seed")
    if no_train:
        add_switch(g, "--no-train", "no training: compress only")
    if teacher:
        g.add_argument(
            "--alpha",
            type=float,
            metavar="X",
            help="weight of the teacher's soft loss when labels exist too (default 0.5; 0: labels only)",
        )
        add_with_default(
            g,
            "--temperature",
            type=float,
            default=temperature,
            metavar="T",
            help="softmax temperature of the soft loss",
        )
        g.add_argument(
            "--soft-loss",
            default="auto",
            choices=["auto", "kl", "mse", "cosine"],
            help="loss against the teacher's outputs (default auto: kl for class scores, mse otherwise)",
        )
    if budget:
        add_budget(p)


def add_scope(p: argparse.ArgumentParser, *, help: str) -> None:
    """``--scope``: magnitude pruning ranks the weights over all layers at once or in each layer
    alone (``compress.prune.unstructured.SCOPES``)."""
    add_with_default(p, "--scope", default=SCOPES[0], choices=SCOPES, help=help)


def add_budget(p: argparse.ArgumentParser) -> None:
    """What a command that trains must keep of the original (``compress.train.budget``)."""
    g = p.add_argument_group(
        "budget (checked on held-out samples, as ONNX Runtime runs the result)"
    )
    g.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=0.02,
        metavar="X",
        help="with labels: the most top-1 accuracy may drop (default 0.02, two points)",
    )
    add_with_default(
        g,
        "--min-agreement",
        type=float,
        default=0.90,
        metavar="X",
        help="class scores without labels: the least top-1 agreement with the original",
    )
    add_with_default(
        g,
        "--min-cosine",
        type=float,
        default=0.90,
        metavar="X",
        help="other outputs: the least mean cosine with the original's",
    )
    add_switch(g, "--keep-anyway", "write the result even when it is outside the budget")


def budget(args: argparse.Namespace):
    """The ``Budget`` of ``add_budget``'s options."""
    from modelpress.compress.train.budget import Budget

    return Budget(
        max_accuracy_drop=args.max_accuracy_drop,
        min_agreement=args.min_agreement,
        min_cosine=args.min_cosine,
    )


def training_args(args: argparse.Namespace, *, train=None) -> dict:
    """The library's keywords for what ``add_training_data`` and ``add_training`` set: the data,
    its labels and limit, the fine-tuning (``training_config``, unless ``train`` is given) and the
    loss against the teacher. One mapping for prune, distill and deep_compress."""
    return {
        "data": args.data,
        "labels_key": args.labels_key,
        "limit": args.limit,
        "train": training_config(args) if train is None else train,
        "alpha": args.alpha,
        "temperature": args.temperature,
        "soft": args.soft_loss,
    }


def training_config(args: argparse.Namespace, *, batch_default: int = 32, lr_default: float = 3e-3):
    """The ``TrainConfig`` of ``add_training``'s options, or False for ``--no-train``."""
    if getattr(args, "no_train", False):
        return False
    from modelpress.compress.train import TrainConfig

    return TrainConfig(
        epochs=args.epochs,
        steps=args.steps,
        batch_size=getattr(args, "batch_size", None) or batch_default,
        lr=args.lr if args.lr is not None else lr_default,
        optimizer=args.optimizer,
        schedule=args.schedule,
        val_fraction=args.val_fraction,
        # real data overfits: stop when the held-out loss has not improved for 5 checks (half a run)
        patience=args.patience if args.patience is not None else 5,
        seed=args.seed,
    )
