"""Reading a user's JSON or TOML file into plain data, every failure as one error.

The readers of cost, hardware and model-config files share what can go wrong before the
content is looked at: the file is missing or unreadable, too large, not UTF-8, not valid
JSON or TOML, or nested too deeply for the parser. Each becomes `error(message)` naming
the file and what it should have been, so a command prints one line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_document(path: str | Path, what: str, error: type[Exception], max_bytes: int | None = None,
                  toml: bool = True) -> Any:
    """The parsed content of `path` (TOML when `toml` and the name ends in .toml, else
    JSON); `error` (an exception type taking a message) for a file that cannot be read,
    is over `max_bytes`, is not UTF-8 or does not parse. `what` names the file in
    messages, e.g. "hardware file"."""
    path = Path(path)
    is_toml = toml and path.suffix.lower() == ".toml"
    kind = "TOML" if is_toml else "JSON"
    try:
        if max_bytes is not None and path.stat().st_size > max_bytes:
            raise error(f"{what} {str(path)!r} is over {max_bytes / 2**20:g} MiB")
        text = path.read_text(encoding="utf-8")
        return tomllib.loads(text) if is_toml else json.loads(text)
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise error(f"{what} {str(path)!r} is not UTF-8 text ({kind})") from None
    except RecursionError:
        raise error(f"{what} {str(path)!r} nests too deeply") from None
    except ValueError as exc:
        raise error(f"{what} {str(path)!r} is not valid {kind}: {exc}") from None
