import sys
from pathlib import Path

# bbfile.py and layer_paths.py sit next to the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
