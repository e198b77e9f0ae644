"""The requests that move a PS's state to the PS that replace it, over the wire.

On Kubernetes a new PS pod cannot read the old pod's shared memory (every ``emptyDir`` is the
pod's own), so a live change of the PS set copies rows PS to PS (:mod:`.ps_transfer` is the new
PS's side, :mod:`.ps_server` the old PS's):

* ``transfer_track``  meta ``{"generation": g}`` -> ``ok`` ``{"rows": n}``: mark every row
  updated from now on (the same ``g`` again keeps the marks; another ``g`` starts afresh);
* ``transfer_untrack`` meta ``{"generation": g}`` -> ``ok``: stop marking, if for ``g``
  (an abandoned change);
* ``transfer_rows``   meta ``{"num_ps": N, "index": k, "start", "count", "dirty", "generation"}``
  -> ``transfer_rows`` arrays ``(new_slots, weights, accum)``: rows ``[start, start + count)``
  of the overlap of this PS with PS ``k`` of ``N`` (:func:`~dlrover_kfp.core.partition.overlap`),
  or with ``dirty`` only those marked since ``transfer_track`` (a sparse reply, new slots
  telling where each goes); refused when this PS does not track ``g``;
* ``transfer_dense``  -> ``transfer_dense`` arrays ``(dense, dense_accum)``, meta ``{"applied":
  ...}`` (PS 0 only; its rows applied per shard, core/applied.py).

A reply is bounded by :data:`MAX_TRANSFER_BYTES`; the requester asks for chunks of about
:data:`CHUNK_BYTES`, so that no request holds the PS long (a chunk is one ``index_select``
under the shared gate, like a lookup) and a GiB moves in a few hundred requests.
"""

from __future__ import annotations

TRACK = "transfer_track"
UNTRACK = "transfer_untrack"
ROWS = "transfer_rows"
DENSE = "transfer_dense"

#: What a requester asks for per ``transfer_rows``: 4 MiB of rows (~31k rows at d = 16).
CHUNK_BYTES = 4 << 20
#: The most a ``transfer_rows`` reply may carry (the server refuses larger ``count``).
MAX_TRANSFER_BYTES = 64 << 20


def row_bytes(embedding_dim: int) -> int:
    """Bytes one row takes in a ``transfer_rows`` reply: its new slot (int64), its weights and
    its accumulator (float32 each)."""
    return 8 + 2 * 4 * embedding_dim


__all__ = ["CHUNK_BYTES", "DENSE", "MAX_TRANSFER_BYTES", "ROWS", "TRACK", "UNTRACK", "row_bytes"]
