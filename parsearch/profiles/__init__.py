"""Machine-profile files: the loader, and the device profiles that ship with parsearch.

Each shipped ``*.yaml`` here describes one kind of device and node (its name is the file's
stem, e.g. ``mi250x-frontier``) from published micro-benchmarks only, every figure with its
source; a space names one with ``estimate: {machine: mi250x-frontier}``. Anything else given
there, or to ``--machine``, is a path (a space's relative to the space file). The format is
:mod:`parsearch.estimate.profile`'s.
"""

from __future__ import annotations

from pathlib import Path

from parsearch.errors import SpaceError
from parsearch.estimate.machine import MachineProfile
from parsearch.estimate.profile import profile_from_dict
from parsearch.space_file import read_document

PROFILE_DIR = Path(__file__).resolve().parent


def shipped() -> dict[str, Path]:
    """The shipped profiles by name."""
    return {path.stem: path for path in sorted(PROFILE_DIR.glob("*.yaml"))}


def resolve(reference: str, base: Path | None = None) -> Path:
    """The file ``reference`` names: a shipped profile's name, else a path (relative to
    ``base`` when given)."""
    profiles = shipped()
    if reference in profiles:
        return profiles[reference]
    path = Path(reference)
    path = base / path if base is not None and not path.is_absolute() else path
    # A shipped name made absolute on the way (``run --machine NAME`` stores the resolved
    # path) still names the shipped profile when no such file exists.
    if not path.exists() and not path.suffix and path.name in profiles:
        return profiles[path.name]
    return path


def load_profile(path: str | Path) -> MachineProfile:
    """Read and validate a machine-profile YAML file (or a shipped profile by name)."""
    path = resolve(str(path))
    try:
        data = read_document(path)
    except SpaceError as error:
        if "not found" in str(error):
            names = ", ".join(shipped())
            raise SpaceError(
                f"machine profile not found (shipped profiles: {names})", source=str(path)
            ) from None
        raise
    return profile_from_dict(data, source=str(path))
