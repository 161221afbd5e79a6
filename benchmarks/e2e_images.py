"""End-to-end image loading: DataLoader+PIL, DataLoader+OpenCV and FastLoader on one image folder,
alternating, in one run (a thin wrapper over ``gpufeed bench``; see benchmarks/README.md).

    python benchmarks/e2e_images.py [ROOT] [--transform eval|train] [--workers 2] [--json OUT] ...

Without ROOT, the demo folder (./demo-data: 1000 photo-like JPEGs of ~400x350 in 10 classes) is
made once and used. Every other option is ``gpufeed bench``'s (``gpufeed bench --help``).
"""

from __future__ import annotations

import sys

from gpufeed.cli import main as gpufeed_main
from gpufeed.cli.bench import prepare_demo_data, write


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        write(__doc__.strip())
        return gpufeed_main(["bench", "--help"])
    if not args or args[0].startswith("-"):
        root, count, reused = prepare_demo_data("demo-data", 1000)
        write(f"no ROOT given: {'using' if reused else 'made'} {root} ({count} images)")
        args.insert(0, str(root))
    return gpufeed_main(["bench", *args])


if __name__ == "__main__":
    sys.exit(main())
