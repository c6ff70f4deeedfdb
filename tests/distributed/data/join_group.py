"""Join a torchrun launch's group as a worker would (torchrun's variables in the environment):
print the rank and the group's directory. ``join_group.py LOGDIR``"""

import sys
from pathlib import Path

from tpu_debug.ranks import torchrun_group

group, rank = torchrun_group(Path(sys.argv[1]), "train", ["train.py"])
print(rank, group.path)
