import sys
from pathlib import Path

import pytest

# bbfile.py and layer_paths.py sit next to the tests; tools/ (testdeps) at the repository root
HERE = Path(__file__).resolve().parent
for path in (str(HERE), str(HERE.parents[1])):
    if path not in sys.path:
        sys.path.insert(0, path)

from layer_paths import KAS  # noqa: E402

from tools.dev import testdeps  # noqa: E402


@pytest.fixture
def nvflashxmlparse() -> Path:
    """meta-tegra wrynose's own layout parser at our pin, only when asked for
    (testdeps.UPSTREAM_ROOT_VARIABLE: the parse tool's work root); CI does not ask."""
    checkout = testdeps.upstream_checkout(
        testdeps.UPSTREAM_ROOT_VARIABLE, "sources-wrynose/meta-tegra", "meta-tegra's nvflashxmlparse",
        pin=testdeps.kas_pin(KAS / "jetson-orin-nano.yml", "meta-tegra"))
    if checkout.skip:
        pytest.skip(checkout.skip)
    if checkout.fail:
        pytest.fail(checkout.fail)
    return checkout.path / "recipes-bsp/tegra-binaries/tegra-helper-scripts/nvflashxmlparse.py"
