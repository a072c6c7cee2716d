import sys

from iceberg_cdc.mirror.verify.cli import main

sys.exit(main())
