"""The ctypes inotify helper: watches, event decoding, errors."""

from __future__ import annotations

import errno
import os
import select
import struct
from pathlib import Path

import pytest
from gpu_device_plugin.host import inotify
from gpu_device_plugin.host.inotify import Event, Inotify, parse_events


def _wait_events(watcher: Inotify, timeout: float = 2.0) -> list[Event]:
    ready, _, _ = select.select([watcher], [], [], timeout)
    assert ready, f"no inotify event within {timeout} s"
    return watcher.read_events()


def test_create_and_delete_in_a_watched_directory_are_reported_with_the_entry_name(tmp_path: Path) -> None:
    with Inotify() as watcher:
        wd = watcher.add_watch(str(tmp_path), inotify.IN_CREATE | inotify.IN_DELETE)
        (tmp_path / "nvmap").write_text("")
        created = _wait_events(watcher)
        (tmp_path / "nvmap").unlink()
        deleted = _wait_events(watcher)
    assert (created[0].wd, created[0].name) == (wd, "nvmap")
    assert created[0].mask & inotify.IN_CREATE, f"expected IN_CREATE, got mask {created[0].mask:#x}"
    assert deleted[0].mask & inotify.IN_DELETE, f"expected IN_DELETE, got mask {deleted[0].mask:#x}"


def test_rename_reports_moved_from_and_moved_to_with_one_cookie(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("")
    with Inotify() as watcher:
        watcher.add_watch(str(tmp_path), inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO)
        os.rename(tmp_path / "a", tmp_path / "b")
        events = _wait_events(watcher)
    by_name = {e.name: e for e in events}
    assert by_name["a"].mask & inotify.IN_MOVED_FROM and by_name["b"].mask & inotify.IN_MOVED_TO
    assert by_name["a"].cookie == by_name["b"].cookie != 0


def test_close_write_and_attrib_are_reported(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    target.write_text("")
    with Inotify() as watcher:
        watcher.add_watch(str(tmp_path), inotify.IN_CLOSE_WRITE | inotify.IN_ATTRIB)
        target.write_text("version: v1\n")
        os.chmod(target, 0o600)
        masks = 0
        while not (masks & inotify.IN_CLOSE_WRITE and masks & inotify.IN_ATTRIB):
            masks |= sum(e.mask for e in _wait_events(watcher) if e.name == "config.yaml")
    assert masks & inotify.IN_CLOSE_WRITE and masks & inotify.IN_ATTRIB


def test_deleting_the_watched_directory_reports_delete_self_then_ignored(tmp_path: Path) -> None:
    watched = tmp_path / "igpu0"
    watched.mkdir()
    with Inotify() as watcher:
        wd = watcher.add_watch(str(watched), inotify.IN_DELETE_SELF)
        watched.rmdir()
        masks = 0
        while not masks & inotify.IN_IGNORED:
            masks |= sum(e.mask for e in _wait_events(watcher) if e.wd == wd)
    assert masks & inotify.IN_DELETE_SELF, f"expected IN_DELETE_SELF in {masks:#x}"


def test_read_events_returns_empty_list_when_nothing_is_pending(tmp_path: Path) -> None:
    with Inotify() as watcher:
        watcher.add_watch(str(tmp_path), inotify.IN_CREATE)
        assert watcher.read_events() == []


def test_watching_a_missing_path_raises_oserror_with_enoent_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with Inotify() as watcher, pytest.raises(OSError) as info:
        watcher.add_watch(str(missing), inotify.IN_CREATE)
    assert info.value.errno == errno.ENOENT
    assert str(missing) in str(info.value)


def test_closed_instance_refuses_fileno_and_close_is_idempotent() -> None:
    watcher = Inotify()
    fd = watcher.fileno()
    watcher.close()
    watcher.close()
    with pytest.raises(ValueError, match="closed"):
        watcher.fileno()
    with pytest.raises(OSError):
        os.fstat(fd)  # the descriptor was really released


def test_same_directory_watched_twice_gets_the_same_watch_descriptor(tmp_path: Path) -> None:
    with Inotify() as watcher:
        first = watcher.add_watch(str(tmp_path), inotify.IN_CREATE)
        second = watcher.add_watch(str(tmp_path), inotify.IN_DELETE)
    assert first == second


def test_rm_watch_stops_events_and_reports_ignored(tmp_path: Path) -> None:
    with Inotify() as watcher:
        wd = watcher.add_watch(str(tmp_path), inotify.IN_CREATE)
        watcher.rm_watch(wd)
        ignored = _wait_events(watcher)
        (tmp_path / "late").write_text("")
        ready, _, _ = select.select([watcher], [], [], 0.1)
    assert [e.mask & inotify.IN_IGNORED for e in ignored] == [inotify.IN_IGNORED]
    assert not ready, "events arrived after rm_watch"


def test_parse_events_decodes_several_records_with_nul_padded_names() -> None:
    def record(wd: int, mask: int, cookie: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name)) if name else b""
        return struct.pack("iIII", wd, mask, cookie, len(padded)) + padded

    data = record(1, inotify.IN_CREATE, 0, b"kubelet.sock") + record(2, inotify.IN_DELETE_SELF, 0, b"")
    assert parse_events(data) == [
        Event(1, inotify.IN_CREATE, "kubelet.sock", 0),
        Event(2, inotify.IN_DELETE_SELF, "", 0),
    ]
