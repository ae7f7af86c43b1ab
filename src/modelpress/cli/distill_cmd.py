"""modelpress distill TEACHER -o OUT (--student S.onnx | --width 0.5): knowledge distillation.

Knowledge distillation: the student learns the teacher's softened outputs (KL at a temperature),
the labels when the data has them, and the teacher's hidden states or feature maps where layers
correspond (transformers, CNN stages). Default training: 10 epochs, temperature 4. The student is a
model file with the teacher's inputs and outputs, or the teacher with a fraction of its channels,
neurons and heads removed.
"""

from __future__ import annotations

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes, human_count, print_notes
from modelpress.cli._training import training_run, write_checked
from modelpress.ir import save


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "distill",
        __doc__,
        help="train a smaller student on a teacher's outputs (student file, or the teacher made narrower)",
        examples=[
            "modelpress distill cnn.onnx --width 0.5 -o student.onnx --data train.npz --labels-key y",
            "modelpress distill bert.onnx --student small.onnx -o student.onnx --data text.npz",
        ],
    )
    options.add_model(p, help="the teacher: an .onnx file")
    options.add_output(p)
    options.add_training_data(p, required=True)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--student",
        metavar="FILE",
        help="the student model (same inputs and outputs as the teacher)",
    )
    who.add_argument(
        "--width",
        type=float,
        metavar="X",
        help="make the student from the teacher: keep this fraction of its channels, neurons and heads",
    )
    options.add_switch(
        p, "--no-features", "do not match hidden states (transformers) or stage outputs (CNNs)"
    )
    options.add_with_default(
        p,
        "--feature-weight",
        type=float,
        default=1.0,
        metavar="X",
        help="weight of the hidden-state / feature-map loss",
    )
    # a student learns from a teacher more slowly than a pruned model recovers: 10 epochs, not 2
    # (benchmarks/results/train.md, distillation); it always trains
    options.add_training(p, epochs=10, temperature=4.0, no_train=False)
    options.add_record(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:
    from modelpress.compress.distill import distill

    student = options.open_model(args.student, args) if args.student else None
    with training_run("distill", args) as (recorder, teacher, progress):
        result = distill(
            teacher,
            student=student,
            width=args.width,
            features="none" if args.no_features else "auto",
            feature_weight=args.feature_weight,
            progress=progress,
            **options.training_args(args),
        )
    print_notes(result.notes)
    if result.features:
        console.print(f"intermediate values matched: {len(result.features)}")
    console.print(
        f"student ({result.student}): parameters {human_count(result.params_teacher)} → {human_count(result.params_student)}, "
        f"size {human_bytes(result.size_teacher)} → {human_bytes(result.size_student)}"
    )
    return write_checked(
        args,
        result,
        [result.training],
        result.to_dict(),
        recorder,
        lambda: save(result.model, args.output),
    )
