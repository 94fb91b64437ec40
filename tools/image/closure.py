"""Which packages an image installs, resolved from bitbake's parse data before any build.

Starting from the image's PACKAGE_INSTALL it follows RDEPENDS and RRECOMMENDS package by
package, choosing the provider of each runtime name the way bitbake does (the preferred
version of each recipe, then PREFERRED_RPROVIDER, then PREFERRED_PROVIDER of what a recipe
provides) and finding the package inside that recipe that carries the name (PACKAGES,
then RPROVIDES, then a PACKAGES_DYNAMIC pattern such as the kernel's `kernel-module-.*`).

Pure: the parse data comes from a `PackageSource`. `tools/image/bitbake_probe.py` backs it with
tinfoil inside the bitbake environment; tests back it with dictionaries. Stdlib only and
Python 3.8 syntax, because the probe runs on the build host's own python3.

What parse data cannot show: dependencies added while packaging (shared-library and
kernel-module dependencies) and whether a dynamic package (a kernel module) is really made;
the manifest check after a build (`tools/image/manifest.py`) covers those."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# How the package carrying a runtime name was found inside its recipe.
BY_PACKAGE = "package"  # the name is one of the recipe's PACKAGES
BY_RPROVIDES = "rprovides"  # a package of the recipe lists it in RPROVIDES
BY_DYNAMIC = "dynamic"  # matches PACKAGES_DYNAMIC: made only if packaging produces it

DEPENDS = "depends"
RECOMMENDS = "recommends"
IMAGE = "image"  # PACKAGE_INSTALL of the image itself


@dataclass(frozen=True)
class Recipe:
    """One parsed recipe, as far as runtime resolution needs it."""

    recipe_id: str  # bitbake's recipe file name (fn)
    pn: str
    packages: tuple[str, ...]
    packages_dynamic: tuple[str, ...] = ()
    rdepends: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per package
    rrecommends: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    provides: tuple[str, ...] = ()  # build-time PROVIDES (for PREFERRED_PROVIDER_*)


class PackageSource:
    """Parse data, asked for lazily: a real build has thousands of recipes."""

    def candidates(self, name: str) -> list[str]:
        """Recipe ids whose packages carry `name` (bitbake's getRuntimeProviders)."""
        raise NotImplementedError

    def recipe(self, recipe_id: str) -> Recipe:
        raise NotImplementedError

    def rprovides(self, recipe_id: str) -> Mapping[str, tuple[str, ...]]:
        """RPROVIDES per package of one recipe (costly in bitbake: asked only when needed)."""
        raise NotImplementedError

    def preferred_recipe_id(self, pn: str) -> str | None:
        """The recipe file bitbake picks for pn (PREFERRED_VERSION, priorities)."""
        raise NotImplementedError

    def setting(self, name: str) -> str:
        """A global variable, e.g. PREFERRED_RPROVIDER_docker; empty when unset."""
        raise NotImplementedError


@dataclass(frozen=True)
class Installed:
    """A package in the closure and the first path that brought it in."""

    package: str
    pn: str
    how: str  # BY_PACKAGE, BY_RPROVIDES, BY_DYNAMIC
    requested_as: str  # the runtime name that was asked for
    via: str  # the package (or "image") that asked
    kind: str  # IMAGE, DEPENDS, RECOMMENDS


@dataclass(frozen=True)
class Unresolved:
    name: str
    via: str
    kind: str
    reason: str


@dataclass
class Closure:
    installed: dict[str, Installed] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # runtime name asked for -> package
    unresolved: list[Unresolved] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    notes: list[str] = field(default_factory=list)

    def package_for(self, name: str) -> Installed | None:
        package = self.names.get(name, name)
        return self.installed.get(package)

    def chain(self, package: str) -> list[str]:
        """How a package got in: image -> ... -> package."""
        path: list[str] = []
        seen = set()
        current: str | None = package
        while current and current in self.installed and current not in seen:
            seen.add(current)
            path.append(current)
            current = self.installed[current].via
        return list(reversed(path))

    def to_json(self) -> dict:
        return {
            "installed": [vars(entry) for entry in self.installed.values()],
            "names": self.names,
            "unresolved": [vars(entry) for entry in self.unresolved],
            "skipped": [list(entry) for entry in self.skipped],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> Closure:
        closure = cls()
        for entry in data.get("installed", []):
            item = Installed(**entry)
            closure.installed[item.package] = item
        closure.names = dict(data.get("names", {}))
        closure.unresolved = [Unresolved(**entry) for entry in data.get("unresolved", [])]
        closure.skipped = [(name, why) for name, why in data.get("skipped", [])]
        closure.notes = list(data.get("notes", []))
        return closure


def _usable(recipe_id: str) -> bool:
    # native/nativesdk variants and other multiconfigs never land in a target image
    return not recipe_id.startswith(("virtual:", "mc:"))


def choose_provider(name: str, source: PackageSource) -> tuple[Recipe | None, str]:
    """The recipe bitbake would take for runtime `name`, and a note when it had to guess."""
    candidates = [rid for rid in source.candidates(name) if _usable(rid)]
    if not candidates:
        return None, ""
    by_pn: dict[str, Recipe] = {}
    for rid in candidates:
        recipe = source.recipe(rid)
        preferred = source.preferred_recipe_id(recipe.pn)
        if preferred is not None and preferred != rid:
            continue  # another version of the same recipe is the one bitbake builds
        by_pn.setdefault(recipe.pn, recipe)
    if not by_pn:
        return None, ""
    if len(by_pn) == 1:
        return next(iter(by_pn.values())), ""
    wanted = source.setting("PREFERRED_RPROVIDER_" + name)
    if wanted in by_pn:
        return by_pn[wanted], ""
    preferred = [
        recipe
        for recipe in by_pn.values()
        if any(source.setting("PREFERRED_PROVIDER_" + provide) == recipe.pn for provide in recipe.provides)
    ]
    if len(preferred) == 1:
        return preferred[0], ""
    pick = sorted(by_pn)[0]
    note = (
        f"several recipes provide {name} ({', '.join(sorted(by_pn))}) and nothing prefers one; "
        f"assumed {pick} (set PREFERRED_RPROVIDER_{name})"
    )
    return by_pn[pick], note


def package_in_recipe(name: str, recipe: Recipe, source: PackageSource) -> tuple[str | None, str]:
    if name in recipe.packages:
        return name, BY_PACKAGE
    for package, provided in source.rprovides(recipe.recipe_id).items():
        if name in provided:
            return package, BY_RPROVIDES
    for pattern in recipe.packages_dynamic:
        if re.match(pattern.replace("+", r"\+"), name):
            return name, BY_DYNAMIC
    # RPROVIDES set for the whole recipe rather than a package: the main package carries it
    if recipe.pn in recipe.packages:
        return recipe.pn, BY_RPROVIDES
    return None, ""


def resolve(
    install: Sequence[str],
    source: PackageSource,
    attempt_only: Sequence[str] = (),
    bad_recommendations: Sequence[str] = (),
    no_recommendations: bool = False,
    package_exclude: Sequence[str] = (),
) -> Closure:
    """The runtime closure of an image: PACKAGE_INSTALL (+ PACKAGE_INSTALL_ATTEMPTONLY, which
    may fail quietly, like recommends) and everything they depend on or recommend."""
    closure = Closure()
    queue = deque([(name, IMAGE, IMAGE) for name in install])
    queue.extend((name, IMAGE, RECOMMENDS) for name in attempt_only)
    bad = set(bad_recommendations)
    excluded = set(package_exclude)
    seen_requests = set()
    while queue:
        name, via, kind = queue.popleft()
        if (name, kind == RECOMMENDS) in seen_requests or name in closure.names:
            continue
        seen_requests.add((name, kind == RECOMMENDS))
        if kind == RECOMMENDS and (no_recommendations or name in bad):
            closure.skipped.append((name, "NO_RECOMMENDATIONS" if no_recommendations else "BAD_RECOMMENDATIONS"))
            continue
        if name in excluded:
            closure.unresolved.append(Unresolved(name, via, kind, "listed in PACKAGE_EXCLUDE"))
            continue
        recipe, note = choose_provider(name, source)
        if note:
            closure.notes.append(note)
        package, how = package_in_recipe(name, recipe, source) if recipe else (None, "")
        if recipe is None or package is None:
            reason = "nothing provides it" if recipe is None else f"{recipe.pn} has no package for it"
            if kind == RECOMMENDS:
                closure.skipped.append((name, f"recommended by {via}, but {reason}"))
            else:
                closure.unresolved.append(Unresolved(name, via, kind, reason))
            continue
        closure.names[name] = package
        if package in closure.installed:
            continue
        closure.installed[package] = Installed(package, recipe.pn, how, name, via, kind)
        queue.extend((dep, package, DEPENDS) for dep in recipe.rdepends.get(package, ()))
        queue.extend((rec, package, RECOMMENDS) for rec in recipe.rrecommends.get(package, ()))
    return closure


class DictSource(PackageSource):
    """A PackageSource over plain data: tests, and a closure saved as JSON."""

    def __init__(
        self,
        recipes: Sequence[Recipe],
        rprovides: Mapping[str, Mapping[str, Sequence[str] | None]] = None,
        settings: Mapping[str, str] | None = None,
        preferred: Mapping[str, str] | None = None,
    ) -> None:
        self._recipes = {recipe.recipe_id: recipe for recipe in recipes}
        self._rprovides = {
            rid: {pkg: tuple(names) for pkg, names in per.items()} for rid, per in (rprovides or {}).items()
        }
        self._settings = dict(settings or {})
        self._preferred = dict(preferred or {})

    def candidates(self, name: str) -> list[str]:
        direct = [
            rid
            for rid, recipe in self._recipes.items()
            if name in recipe.packages or any(name in names for names in self._rprovides.get(rid, {}).values())
        ]
        if direct:
            return direct
        return [
            rid
            for rid, recipe in self._recipes.items()
            if any(re.match(pattern.replace("+", r"\+"), name) for pattern in recipe.packages_dynamic)
        ]

    def recipe(self, recipe_id: str) -> Recipe:
        return self._recipes[recipe_id]

    def rprovides(self, recipe_id: str) -> Mapping[str, tuple[str, ...]]:
        return self._rprovides.get(recipe_id, {})

    def preferred_recipe_id(self, pn: str) -> str | None:
        return self._preferred.get(pn)

    def setting(self, name: str) -> str:
        return self._settings.get(name, "")
