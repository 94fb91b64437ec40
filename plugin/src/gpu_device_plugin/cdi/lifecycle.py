"""When the CDI spec is written and when it goes: it outlives the plugin on purpose.

The kubelet hands a restarting container the CDI names Allocate gave it, without asking
the plugin again; a spec removed at every stop makes a GPU container that restarts while
the plugin restarts (an upgrade, a crash) fail. So the spec is removed only when CDI is
turned off, or when its kind or directory changes (the old file then names nothing we
serve). File errors are logged, never raised: a reload or a stop must not die on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..config.settings import Settings
from ..model import Gpu
from . import spec, toolkit_spec

log = logging.getLogger(__name__)


class CdiSpecKeeper:
    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = list(gpus)

    def sync(self, settings: Settings) -> None:
        """Write the spec when a cdi-* strategy is on, remove it (left by an earlier run) when off."""
        try:
            path = spec.sync_spec(self._gpus, settings)
        except (OSError, ValueError) as exc:
            if spec.cdi_enabled(settings):
                log.error("CDI spec not written, containers asking for CDI devices will fail: %s", exc)
            else:
                log.error("CDI is off but the old spec stays: %s", exc)
            return
        if path:
            log.info("CDI spec for %s written to %s", settings.cdi_kind, path)
        if spec.cdi_enabled(settings):
            toolkit_spec.report(self._gpus, settings)

    def switch(self, old: Settings, new: Settings) -> None:
        """Apply a configuration change: the old kind's spec goes when the kind or directory changes."""
        if (old.cdi_kind, old.cdi_spec_dir) != (new.cdi_kind, new.cdi_spec_dir) and spec.cdi_enabled(old):
            try:
                if spec.remove_spec(old.cdi_spec_dir, old.cdi_kind):
                    log.info("CDI kind or directory changed: removed the spec for %s from %s",
                             old.cdi_kind, old.cdi_spec_dir)
            except OSError as exc:
                log.error("%s", exc)
        if spec.cdi_enabled(new) or spec.cdi_enabled(old):
            self.sync(new)
