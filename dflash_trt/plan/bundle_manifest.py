"""The manifest as ``plan`` writes and reads it: ingest's envelope with the recipe typed.

``ingest`` sits below ``plan`` (``tests/test_layout.py``), so its :class:`~dflash_trt.ingest.Manifest`
holds the recipe as the JSON object it is on disk: the record of what the build read, kept as it
is by the readers that never look at it (``runtime``, ``serve``) and by ``tune`` when it rewrites a
manifest. :class:`BundleManifest` is that manifest with ``recipe`` a :class:`Recipe`: ``build``
writes one, and :func:`read_bundle_manifest` is the one reader of the recipe it stored.

Invariants: a :class:`BundleManifest` serialises to the JSON the envelope would hold (the recipe in
full, without ``incomplete`` and ``source``: what ``build`` has always written), so typing the
recipe changes no byte of ``manifest.json``. A stored recipe that today's :class:`Recipe` refuses
(a bundle built before a key was renamed or a release dropped) is one line saying to rebuild, from
this reader only: the bundle itself still serves and runs, read through ``ingest`` as before.
"""

from __future__ import annotations

from pydantic import Field, ValidationError, field_serializer

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError
from dflash_trt.plan.recipe_model import Recipe

# What the manifest leaves out of the recipe: where it was loaded from (``inputs`` and
# ``recipe_source`` record that) and what the published configs lacked (resolved by the build).
NOT_STORED = {"source", "incomplete"}


class BundleManifest(ingest.Manifest):
    """``manifest.json``. Written as given (unset fields left out), so a bundle's manifest reads
    back field for field; ``format`` is always written, and the recipe in full."""

    # A subclass narrows the envelope's dict to the model it stores (pydantic validates it as such).
    recipe: Recipe | None = Field(  # type: ignore[assignment]
        None,
        description="The recipe the bundle was built from, every field (set or default) but what the "
        "published configs lacked (incomplete); its local paths absolute.",
    )

    @field_serializer("recipe")
    def _recipe_as_stored(self, recipe: Recipe | None) -> dict | None:
        """The recipe as ``build`` stores it: every field, whether set or default."""
        return None if recipe is None else recipe.model_dump(mode="json", exclude=NOT_STORED)


def read_bundle_manifest(bundle: ingest.Bundle) -> BundleManifest:
    """``bundle``'s manifest (as ``ingest`` read it) with its recipe typed; one line saying to
    rebuild where today's :class:`Recipe` refuses the recipe it stored."""
    manifest = bundle.built
    try:
        return BundleManifest.model_validate(manifest.to_json())
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise CheckpointError(
            f"{bundle.manifest_path}: the recipe it was built from no longer reads as a recipe "
            f"({loc}: {first['msg']}{more}); rebuild the bundle with 'dflash-trt build'"
        ) from None
