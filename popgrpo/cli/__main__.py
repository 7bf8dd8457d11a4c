import sys

from popgrpo.cli import main

sys.exit(main())
