"""A paged KV cache in the spirit of vLLM's PagedAttention (Kwon et al., 2023, arXiv 2309.06180).

A contiguous cache reserves `max_len` slots per sequence up front, and G samples of one prompt
hold G copies of that prompt's keys. A paged cache instead cuts every sequence into fixed-size
blocks of `block_size` tokens, like virtual memory cuts a process into pages:

    physical pool (per layer)   (num_blocks, block_size, K, D) for keys, the same for values
    block table (per sequence)  logical block i -> physical block id
    refcount (per block)        how many block tables point at it; 0 = on the free list

    token at position p of sequence b lives in slot  table[b][p // block_size] * block_size + p % block_size

Forking a sequence (G samples of one prompt) copies its block table, not its data: every block of
the prompt is referenced G times. A block is copied only when a sequence is about to write into a
block that someone else still references (copy-on-write), which happens at most once per
sequence, for the prompt's partially filled last block; full prompt blocks stay shared forever.
Beam search (`rlhf_lab.sampling.beam_search`) reorders rows every step with `select`: a beam's
children share its blocks, and each child copies the shared partial block when it writes into it.

The attention kernel here is ordinary SDPA, so `update` gathers each row's blocks back into a
dense (B, K, S, D) tensor; vLLM's kernel reads the blocks in place instead. What this module
shows is the memory bookkeeping: how few blocks G samples need (`blocks_in_use`) compared with G
contiguous copies (`blocks_if_contiguous`).
"""

from __future__ import annotations

import math

import torch

from ..util.validation import check_number


class PagedKVCache:
    """Block-paged KV cache with reference-counted blocks and copy-on-write.

    Args:
        config: a `ModelConfig` (uses num_hidden_layers, num_key_value_heads, head_dim).
        batch_size: number of sequences fed to the first forward (B).
        max_len: longest sequence (prompt + completion) any row will reach.
        block_size: tokens per block (vLLM's default is 16).
        num_blocks: size of the physical pool. Default: `max_sequences * ceil(max_len / block_size)`,
            i.e. every sequence that will ever be alive at once could reach `max_len` with no sharing
            at all. That is also enough for copy-on-write: a sequence never references more than
            ceil(len / block_size) blocks, and a CoW swaps one of its references for a fresh block
            while the old block stays referenced by its other owners, so at every moment
            blocks in use <= sum over live sequences of ceil(len / block_size). No extra slack is
            needed; sharing only makes the pool emptier.
        max_sequences: most sequences alive at once, used for the default pool size. Default
            `batch_size`; pass B * G if the cache will be `expand`ed to G samples per prompt.
        device, dtype: of the pools.

    Interface (shared with `DynamicCache` / `StaticCache`): `update`, `get_seq_length`, `expand`, `nbytes`.
    Sharing: `select` (keep / repeat / reorder rows: parallel samples, beam search), `fork`, `release`.
    Inspection: `read`, `blocks_in_use`, `blocks_if_contiguous`, `refcounts`, `check_invariants`.
    """

    def __init__(
        self,
        config,
        batch_size: int,
        max_len: int,
        block_size: int = 16,
        num_blocks: int | None = None,
        device=None,
        dtype=torch.float32,
        max_sequences: int | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("block_size", block_size)):
            check_number(name, value, low=1, integer=True)
        max_sequences = batch_size if max_sequences is None else max_sequences
        check_number("max_sequences", max_sequences, low=batch_size, integer=True)  # at least the batch
        if num_blocks is None:
            num_blocks = max_sequences * math.ceil(max_len / block_size)
        check_number("num_blocks", num_blocks, low=1, integer=True)
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_len = max_len
        pool_shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        L = self.num_layers
        self.key_pool = [torch.zeros(pool_shape, device=device, dtype=dtype) for _ in range(L)]
        self.value_pool = [torch.zeros(pool_shape, device=device, dtype=dtype) for _ in range(L)]
        self.refcount = [0] * num_blocks
        # Pop from the end: blocks are handed out in order 0, 1, 2, ... (easier to read in a picture).
        self.free_list = list(range(num_blocks - 1, -1, -1))
        self.block_tables: list[list[int]] = [[] for _ in range(batch_size)]
        self.length = 0  # tokens held by every sequence, after the last completed forward
        self.cow_copies = 0  # blocks copied by copy-on-write so far (a statistic for the notebook)
        # Set by layer 0's update, reused by layers 1..L-1 of the same forward.
        self._slots: torch.Tensor | None = None  # (B * T,) flat slot index of each new token
        self._table: torch.Tensor | None = None  # (B, num_logical_blocks) physical block ids

    # ------------------------------------------------------------------ allocation bookkeeping
    def _allocate(self) -> int:
        if not self.free_list:
            raise RuntimeError(
                f"PagedKVCache is out of blocks: all num_blocks={self.num_blocks} blocks of "
                f"block_size={self.block_size} are in use ({len(self.block_tables)} sequences of "
                f"{self.length} tokens); pass a larger num_blocks (or max_sequences)"
            )
        block = self.free_list.pop()
        self.refcount[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free_list.append(block)

    def _prepare_write(self, num_new: int, device: torch.device) -> None:
        """Make room for `num_new` tokens in every sequence; remember where they go.

        Allocates a block whenever a sequence crosses a block boundary, and copies (for all layers)
        any block that is about to be written while another sequence still references it.
        """
        start, end = self.length, self.length + num_new
        if end > self.max_len:
            raise ValueError(f"PagedKVCache: max_len={self.max_len}, but {end} tokens were requested")
        first_block, last_block = start // self.block_size, (end - 1) // self.block_size
        copy_src, copy_dst = [], []
        for table in self.block_tables:
            for logical in range(first_block, last_block + 1):
                if logical == len(table):  # crossing into a new block
                    table.append(self._allocate())
                elif self.refcount[table[logical]] > 1:  # shared block about to be written: copy it
                    old = table[logical]
                    table[logical] = self._allocate()
                    self._release(old)  # still >= 1: the other owners keep it
                    copy_src.append(old)
                    copy_dst.append(table[logical])
        if copy_src:
            src = torch.tensor(copy_src, device=device)
            dst = torch.tensor(copy_dst, device=device)
            for pool in self.key_pool + self.value_pool:  # the whole block, every layer
                pool.index_copy_(0, dst, pool.index_select(0, src))
            self.cow_copies += len(copy_src)
        self._table = torch.tensor(self.block_tables, device=device, dtype=torch.long)  # (B, n_blocks)
        positions = torch.arange(start, end, device=device)  # (T,)
        # slot = table[b][p // block_size] * block_size + p % block_size
        slots = self._table[:, positions // self.block_size] * self.block_size + positions % self.block_size
        self._slots = slots.reshape(-1)  # (B * T,), row-major like key.transpose(1, 2).reshape(B * T, ...)

    # ------------------------------------------------------------------ the cache interface
    def update(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values (B, K, T, D) and return all of them, (B, K, S, D) with S = past + T."""
        B, K, T, D = key.shape
        if B != len(self.block_tables):
            raise ValueError(f"PagedKVCache holds {len(self.block_tables)} sequences, got a batch of {B}")
        if layer_idx == 0:
            self._prepare_write(T, key.device)
        for pool, new in ((self.key_pool[layer_idx], key), (self.value_pool[layer_idx], value)):
            flat = pool.view(self.num_blocks * self.block_size, K, D)  # slot-major view of the pool
            flat.index_copy_(0, self._slots, new.transpose(1, 2).reshape(B * T, K, D).to(pool.dtype))
        keys, values = self._gather(layer_idx, self._table, self.length + T)
        if layer_idx == self.num_layers - 1:
            self.length += T
        return keys, values

    def _gather(self, layer_idx: int, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read `length` positions of every row through `table` (B, n_blocks): keys, values (B, K, S, D)."""
        B, K, D = table.shape[0], self.num_kv_heads, self.head_dim
        # (B, n_blocks, bs, K, D) -> (B, n_blocks * bs, K, D), keep the first `length` slots -> (B, K, S, D).
        # Made contiguous so that attention reads the same (K, S, D) layout as from a contiguous cache:
        # the kernels then add in the same order, and paged and contiguous decoding agree bit for bit.
        return tuple(pool[table].reshape(B, -1, K, D)[:, :length].transpose(1, 2).contiguous()
                     for pool in (self.key_pool[layer_idx], self.value_pool[layer_idx]))

    def read(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values of layer `layer_idx` for every sequence, (B, K, S, D) each (a copy).

        For inspection and tests: what the next forward's attention will read for each row."""
        table = torch.tensor(self.block_tables, dtype=torch.long, device=self.key_pool[0].device)
        return self._gather(layer_idx, table.reshape(len(self.block_tables), -1), self.length)

    def get_seq_length(self) -> int:
        return self.length

    def select(self, rows: list[int] | torch.Tensor) -> PagedKVCache:
        """Keep sequences `rows` (in that order, repeats allowed), sharing blocks instead of copying.

        New block tables are copies of the chosen rows' tables; every block's refcount becomes the
        number of new tables pointing at it, and blocks no longer referenced return to the free list.
        This one operation gives `expand` (parallel samples), `fork` and beam-search reordering.
        Modifies the cache in place and returns it.
        """
        rows = [int(r) for r in rows]
        for r in rows:
            if not 0 <= r < len(self.block_tables):
                raise IndexError(f"row {r} out of range for {len(self.block_tables)} sequences")
        new_tables = [list(self.block_tables[r]) for r in rows]
        for table in new_tables:  # take the new references first so no shared block is freed in between
            for block in table:
                self.refcount[block] += 1
        for table in self.block_tables:
            for block in table:
                self._release(block)
        self.block_tables = new_tables
        self._slots = self._table = None
        return self

    def release(self) -> PagedKVCache:
        """Drop every sequence: all blocks return to the free list (as a server does when a request ends)."""
        return self.select([])

    def expand(self, repeats: int) -> PagedKVCache:
        """Row b becomes rows b*repeats .. b*repeats + repeats - 1, sharing b's blocks (no data copied).

        The parent row's reference passes to its first child, so each of b's blocks goes from
        refcount r to r + repeats - 1. Modifies the cache in place (the B parent rows no longer
        exist) and returns it, so `cache = cache.expand(G)` works as for the other caches.
        """
        check_number("repeats", repeats, low=1, integer=True)
        return self.select([b for b in range(len(self.block_tables)) for _ in range(repeats)])

    def fork(self, row: int, copies: int = 1) -> PagedKVCache:
        """Append `copies` new sequences that share row `row`'s blocks; the parent row stays (in place)."""
        return self.select(list(range(len(self.block_tables))) + [row] * copies)

    def nbytes(self) -> int:
        """Bytes of the physical pools (the whole preallocated pool, used or not)."""
        return sum(t.numel() * t.element_size() for t in self.key_pool + self.value_pool)

    # ------------------------------------------------------------------ statistics
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, keys and values."""
        element_size = self.key_pool[0].element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element_size

    def used_nbytes(self) -> int:
        """Bytes of the blocks actually referenced: blocks_in_use * block_bytes."""
        return self.blocks_in_use() * self.block_bytes()

    def blocks_in_use(self) -> int:
        """Distinct physical blocks referenced by at least one sequence."""
        return self.num_blocks - len(self.free_list)

    def free_blocks(self) -> int:
        return len(self.free_list)

    def blocks_if_contiguous(self) -> int:
        """Blocks the same sequences would need with no sharing: sum over rows of ceil(len / block_size)."""
        return len(self.block_tables) * math.ceil(self.length / self.block_size)

    def block_table_rows(self) -> list[list[int]]:
        """Each sequence's block table as Python lists (logical block i -> physical id), for pictures."""
        return [list(table) for table in self.block_tables]

    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent: every block's refcount equals the
        number of block-table entries pointing at it (so none is negative), the free list holds exactly
        the blocks with refcount 0, each once, and every table has ceil(length / block_size) blocks."""
        counts = [0] * self.num_blocks
        for table in self.block_tables:
            for block in table:
                counts[block] += 1
        assert all(c >= 0 for c in self.refcount), "negative refcount"
        assert counts == self.refcount, "a refcount differs from the number of tables pointing at the block"
        assert sorted(self.free_list) == [b for b in range(self.num_blocks) if counts[b] == 0], "free list"
        needed = math.ceil(self.length / self.block_size)
        assert all(len(table) == needed for table in self.block_tables), "a block table has the wrong length"

    def refcounts(self, row: int) -> list[int]:
        """Reference count of each block in row `row`'s table (> 1 = shared with another sequence)."""
        return [self.refcount[block] for block in self.block_tables[row]]
