import sys

from calibkit.cli import main

sys.exit(main())
