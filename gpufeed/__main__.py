"""``python -m gpufeed``: the gpufeed command line."""

from gpufeed.cli import main

raise SystemExit(main())
