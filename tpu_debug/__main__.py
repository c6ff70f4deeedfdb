import sys

from tpu_debug_launcher import main

sys.exit(main())
