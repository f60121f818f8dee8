// Forward producer, warp 0 (one lane): takes query tiles in the order of schedule/forward_tile_order.hpp, announces
// each to the MMA warpgroups through the tile ring, loads its Q once and streams the K and V tiles it visits
// ([kv_first, kv_first + kv_tiles)) through their two rings, all with TMA. The kernels of Config::kDealsTiles, which
// run where every tile is equally long, deal the tiles among the CTAs round robin (ForwardTileOrder::dealt_tile),
// the others take them from the global counter. In the paired kernels (Config::kPaired) the two CTAs of a cluster,
// dealt one head's neighbouring query tiles in every turn, each load half of every K and V tile into both. The varlen
// kernels (run_packed) take the tiles of the maximum problem in the same order, skip those past their sequence's
// query tiles, and fit each to its sequence: its mask, its key/value tiles, its rows.
#pragma once

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct ForwardLoader {
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;

  __device__ static void run(const Params& p, SharedStorage& smem) {
    if constexpr (Config::kVarlen) {
      run_packed(p, smem);
    } else {
      run_dense(p, smem);
    }
  }

 private:
  __device__ static void run_dense(const Params& p, SharedStorage& smem) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    const ForwardTileOrder& order = p.tiles;
    const int num_tiles = order.num_tiles();
    const int group = order.heads_q / p.heads_kv;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    const auto q_extent = make_shape(order.mask.seqlen_q, int{Config::kHeadDim}, order.heads_q, order.batch);
    const auto kv_extent = make_shape(order.mask.seqlen_k, int{Config::kHeadDim}, p.heads_kv, order.batch);
    // In a pair this CTA loads its share of each K and V tile into both CTAs (tma_load_tile's multicast form).
    const int cta_rank = Config::kPaired ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
    int tiles = 0;
    int kv_loads = 0;
    const auto load = [&](int t) {
      const ForwardTileRecord tile = order.tile_at(t);
      smem.tiles.publish(tile, tiles);
      smem.q_stages.producer_acquire(tiles, "q_empty");
      tma_load_tile(p.tma_q, q_extent, tile.head, tile.batch, tile.q_tile,
                    smem.q_stages.producer_expect(tiles, Config::kQBytes), sQ);
      const int kv_first = Config::kLeftBounded ? tile.kv_first : 0;  // 0 without a left bound
      for (int j = 0; j < tile.kv_tiles; ++j, ++kv_loads) {
        const int k_stage = smem.k_stages.producer_acquire(kv_loads, "k_empty");
        tma_load_tile<Config::kClusterCtas>(p.tma_k, kv_extent, tile.head / group, tile.batch, kv_first + j,
                                            smem.k_stages.producer_expect(kv_loads, Config::kKVTileBytes),
                                            sK(_, _, k_stage), cta_rank);
        const int v_stage = smem.v_stages.producer_acquire(kv_loads, "v_empty");
        tma_load_tile<Config::kClusterCtas>(p.tma_v, kv_extent, tile.head / group, tile.batch, kv_first + j,
                                            smem.v_stages.producer_expect(kv_loads, Config::kKVTileBytes),
                                            sV(_, _, v_stage), cta_rank);
      }
      ++tiles;
    };
    if constexpr (Config::kDealsTiles) {
      for (int turn = 0;; ++turn) {
        const int t = ForwardTileOrder::dealt_tile(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), turn);
        if (t >= num_tiles) break;
        load(t);
      }
    } else {
      for (int t = atomicAdd(p.tile_counter, 1); t < num_tiles; t = atomicAdd(p.tile_counter, 1)) load(t);
    }
    smem.tiles.publish(ForwardTileRecord{kEndOfTiles, 0, 0, 0, 0}, tiles);
    if constexpr (Config::kPaired) {
      // The other CTA's MMA warpgroups release this CTA's K and V stages from afar, so this CTA may exit only once
      // all their releases have arrived: both CTAs load the same positions, and the releases of the last kStages
      // complete the rings' last phases (which complete in order).
      for (int position = kv_loads; position < kv_loads + Config::kStages; ++position) {
        smem.k_stages.producer_acquire(position, "k_empty, the pair's last releases");
        smem.v_stages.producer_acquire(position, "v_empty, the pair's last releases");
      }
    }
  }

  // run() for a packed varlen batch. Every sequence's tiles are those of a dense problem of its lengths under the
  // plan's mask (fit_forward_tile, schedule/varlen.hpp); a tile whose rows see no key (causal, seqlen_q > seqlen_k)
  // visits none and the MMA warpgroups write O = 0 and LSE = -inf.
  __device__ static void run_packed(const Params& p, SharedStorage& smem) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    const ForwardTileOrder& order = p.tiles;
    const int num_tiles = order.num_tiles();
    const int group = order.heads_q / p.heads_kv;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    const auto q_extent = make_shape(p.packed.total_q, int{Config::kHeadDim}, order.heads_q, 1);
    const auto kv_extent = make_shape(p.packed.total_k, int{Config::kHeadDim}, p.heads_kv, 1);
    int tiles = 0;
    int kv_loads = 0;
    for (int t = atomicAdd(p.tile_counter, 1); t < num_tiles; t = atomicAdd(p.tile_counter, 1)) {
      const ForwardTile planned = order.tile_at(t);
      const PackedSequence sequence = packed_sequence(p.packed, planned.batch);
      const FittedForwardTile fitted = fit_forward_tile(order, planned, sequence.lengths);
      if (!fitted.valid) continue;  // past the sequence's last query tile
      typename Config::TileRecord tile{};
      static_cast<ForwardTile&>(tile) = fitted.tile;
      tile.mask = fitted.mask;
      tile.q_offset = sequence.q_offset;
      smem.tiles.publish(tile, tiles);
      smem.q_stages.producer_acquire(tiles, "q_empty");
      tma_load_rows(p.tma_q, q_extent, tile.head, sequence.q_offset + tile.q_tile * Config::kBlockM,
                    smem.q_stages.producer_expect(tiles, Config::kQBytes), sQ);
      for (int j = 0; j < tile.kv_tiles; ++j, ++kv_loads) {
        const int kv_row = sequence.k_offset + (tile.kv_first + j) * Config::kBlockN;
        const int k_stage = smem.k_stages.producer_acquire(kv_loads, "k_empty");
        tma_load_rows(p.tma_k, kv_extent, tile.head / group, kv_row,
                      smem.k_stages.producer_expect(kv_loads, Config::kKVTileBytes), sK(_, _, k_stage));
        const int v_stage = smem.v_stages.producer_acquire(kv_loads, "v_empty");
        tma_load_rows(p.tma_v, kv_extent, tile.head / group, kv_row,
                      smem.v_stages.producer_expect(kv_loads, Config::kKVTileBytes), sV(_, _, v_stage));
      }
      ++tiles;
    }
    typename Config::TileRecord end{};
    end.kv_tiles = kEndOfTiles;
    smem.tiles.publish(end, tiles);
  }
};

}  // namespace dash::sm90
