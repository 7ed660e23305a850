"""Makes `import ec_protocol` work from these tests without installing it:
the package lives in protocol/python, which is put first on sys.path."""

import sys
from pathlib import Path

PROTOCOL_PYTHON = Path(__file__).resolve().parents[1]
if str(PROTOCOL_PYTHON) not in sys.path:
    sys.path.insert(0, str(PROTOCOL_PYTHON))
