"""``python -m simulation CONFIG.toml --out DIR [--set key=value ...] [--overwrite]``"""

from simulation.runner import main

raise SystemExit(main())
