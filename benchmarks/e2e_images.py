"""End-to-end image loading: DataLoader+PIL, DataLoader+OpenCV and FastLoader on one image folder,
alternating, in one run: ``gpufeed bench`` with the project's goals (benchmarks/_goals.py) after
each comparison, and in the JSON (see benchmarks/README.md).

    python -m benchmarks.e2e_images [ROOT] [--transform eval|train] [--workers 2] [--json OUT] ...

Without ROOT, the demo folder (./demo-data: 1000 photo-like JPEGs of ~400x350 in 10 classes) is
made once and used. Every other option is ``gpufeed bench``'s (``gpufeed bench --help``).
"""

from __future__ import annotations

import functools
import sys

from benchmarks._goals import annotate_image_run
from gpufeed.cli import build_parser, run_command
from gpufeed.cli import main as gpufeed_main
from gpufeed.cli.bench import prepare_demo_data, run_bench, write


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        write(__doc__.strip())
        return gpufeed_main(["bench", "--help"])
    if not args or args[0].startswith("-"):
        root, count, reused = prepare_demo_data("demo-data", 1000)
        write(f"no ROOT given: {'using' if reused else 'made'} {root} ({count} images)")
        args.insert(0, str(root))
    parsed = build_parser().parse_args(["bench", *args])
    parsed.run = functools.partial(run_bench, annotate=annotate_image_run)
    return run_command(parsed)


if __name__ == "__main__":
    sys.exit(main())
