"""``python -m dflash_trt.train``: one training rank, as torchrun starts it (see ``launcher``)."""

import sys

from dflash_trt.train.launcher import main

sys.exit(main())
