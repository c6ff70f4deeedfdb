import sys

from tpu_debug.cli import main

sys.exit(main())
