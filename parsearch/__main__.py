import sys

from parsearch.cli import main

sys.exit(main())
