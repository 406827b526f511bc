"""Names of the hidden files a writer keeps beside its output (``.NAME.lock``, ``.NAME.partial-PID``)
never pass the file system's name limit when NAME itself is legal.

``NAME_MAX`` is 255 bytes on Linux file systems; a 250-byte ``-o`` name is legal, its lock name
``.NAME.lock`` is not. A sibling name that would pass the limit keeps a readable head of NAME and
a hash of all of it (the same NAME always gives the same sibling, two NAMEs differing only past the
head give different ones), so a second build of the same output still finds the first one's lock.
"""

from __future__ import annotations

import hashlib

NAME_MAX = 255    # bytes in one path component (Linux: ext4, xfs, btrfs, tmpfs)
PID_ROOM = 8      # what a writer appends after a partial's prefix: "-" and a pid (pid_max 4194304)


def sibling(name: str, tag: str, room: int = 0) -> str:
    """``.NAME.TAG``, or ``.HEAD~HASH.TAG`` when that (plus ``room`` bytes the caller appends) would
    pass :data:`NAME_MAX`."""
    plain = f".{name}.{tag}"
    if len(plain.encode("utf-8", "surrogateescape")) + room <= NAME_MAX:
        return plain
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    head = name.encode("utf-8", "surrogateescape")[:64].decode("utf-8", "ignore")
    return f".{head}~{digest}.{tag}"
