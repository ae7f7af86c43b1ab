"""modelpress pipeline MODEL -o OUT --pre ... --post ...: store pre/post-processing in a model.

Declare once how raw items (images, texts, audio) become the model's inputs and how its outputs
become answers; the declaration is checked against the model and stored in its metadata, so `run`,
`serve` and the Python API apply exactly the same steps.
"""

from __future__ import annotations

from modelpress.cli import options
from modelpress.cli._common import console
from modelpress.cli.options import Recorder, add_model, add_output, add_record, open_model
from modelpress.errors import OptionError
from modelpress.ir import save
from modelpress.ir.files import output_dir
from modelpress.runtime.processing import METADATA_KEY, Processing, read_spec

EPILOG = """\
pre-processing (--pre KIND:KEY=VALUE,...; lists continue after a comma: mean=0.485,0.456,0.406):
  image:  resize=N|HxW crop=N|HxW interp=bilinear|nearest|bicubic|lanczos color=rgb|bgr|gray
          scale=F mean=F,.. std=F,.. layout=nchw|nhwc dtype=float32|uint8|.. input=NAME
  text:   tokenizer=tokenizer.json max_length=N padding=longest|max_length truncation=true|false
          pad_id=N ids=NAME mask=NAME types=NAME
  audio:  format=wav|s16le|s32le|f32le|u8 rate=HZ channels=N length=SAMPLES frame=N hop=N input=NAME
post-processing (--post KEY[=VALUE],...):
  softmax sigmoid argmax topk=K threshold=T labels=labels.txt output=NAME

examples:
  modelpress pipeline cnn.onnx -o cnn.onnx --pre image:resize=256,crop=224,mean=0.485,0.456,0.406,std=0.229,0.224,0.225 --post softmax,topk=5,labels=labels.txt
  modelpress pipeline encoder.onnx -o encoder.onnx --pre text:tokenizer=tokenizer.json,max_length=128
  modelpress pipeline cnn.onnx -o cnn.onnx --spec processing.yaml
  modelpress pipeline cnn.onnx            # show what the model declares
"""


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "pipeline",
        __doc__,
        help="store pre- and post-processing in a model, for run, serve and the API",
        epilog=EPILOG,
    )
    add_model(p, help="an .onnx file")
    add_output(
        p,
        required=False,
        help="where to write the model with its declaration (may be MODEL itself)",
    )
    p.add_argument(
        "--pre",
        metavar="KIND:KEY=VALUE,...",
        help="pre-processing: image:..., text:... or audio:...",
    )
    p.add_argument(
        "--post",
        metavar="KEY[=VALUE],...",
        help="post-processing, e.g. softmax,topk=5,labels=labels.txt; for a detector boxes=yolo|rows|yolov5,threshold=0.25,iou=0.45,topk=100 (decoding and non-maximum suppression)",
    )
    p.add_argument(
        "--spec",
        metavar="FILE",
        help="a JSON or YAML file with pre and/or post (--pre/--post override it)",
    )
    options.add_switch(p, "--remove", "remove the model's declaration")
    add_record(p)
    p.set_defaults(func=run)


def run(args) -> int:

    declaring = args.pre or args.post or args.spec
    if args.output:
        output_dir(args.output)
    elif declaring or args.remove:
        raise OptionError("-o/--output: say where to write the model (it may be MODEL itself)")
    if args.remove and declaring:
        raise OptionError("--remove: give it alone, without --pre/--post/--spec")
    model = open_model(args.model, args)
    recorder = Recorder("pipeline", args)
    if not declaring and not args.remove:
        proc = Processing.from_model(model)
        if proc is None:
            console.print(f"{args.model}: no processing declared")
        for line in proc.describe() if proc else []:
            console.print(line)
        return 0
    if args.remove:
        model.metadata_props.pop(METADATA_KEY, None)
        save(model, args.output)
        console.print(f"wrote {args.output} (no processing declared)")
        recorder.write({"processing": None})
        return 0
    # Files named in the spec are relative to its folder (read_spec resolves them), the others
    # to the current one.
    spec = read_spec(args.spec) if args.spec else {}
    proc = Processing.declare(
        model, pre=args.pre or spec.get("pre"), post=args.post or spec.get("post")
    )
    proc.store(model)
    save(model, args.output)
    for line in proc.describe():
        console.print(line)
    console.print(f"wrote {args.output}")
    recorder.write({"processing": proc.to_dict()})
    return 0
