"""``python -m kaos_otel``: the ``kaos-otel`` command."""

from kaos_otel.cli import main

raise SystemExit(main())
