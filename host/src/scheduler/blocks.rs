//! The paged KV cache's block manager: which cache blocks each sequence owns,
//! with prefix caching (vLLM style): every full block is identified by a hash
//! of its tokens and of everything before it, so a new request whose prompt
//! starts like an earlier one reuses those blocks instead of recomputing them.
//! Blocks no sequence uses stay cached until their space is needed (least
//! recently freed first).

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// Identifies a full block by its tokens and its prefix.
pub type BlockHash = u64;

/// Not enough free blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the KV cache is full ({needed} more blocks needed, {free} free)")]
pub struct OutOfBlocks {
    /// Blocks asked for.
    pub needed: usize,
    /// Blocks available.
    pub free: usize,
}

/// The blocks of one sequence, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SequenceBlocks {
    /// Block ids; position `p` lives in `blocks[p / block_size]`.
    pub blocks: Vec<u32>,
    /// Hashes of the leading full blocks that are registered in the cache.
    hashes: Vec<BlockHash>,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt blocks looked up.
    pub queries: u64,
    /// Of those, found in the cache.
    pub hits: u64,
}

/// Allocates cache blocks to sequences.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    ref_counts: Vec<u32>,
    /// Blocks holding nothing.
    free: Vec<u32>,
    /// Unreferenced blocks that still hold a cached prefix, oldest first.
    evictable: VecDeque<u32>,
    /// Cached full blocks by hash.
    cached: HashMap<BlockHash, u32>,
    /// The hash each block is registered under.
    hash_of: Vec<Option<BlockHash>>,
    prefix_caching: bool,
    stats: PrefixStats,
}

impl BlockManager {
    /// `num_blocks` blocks of `block_size` positions.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            evictable: VecDeque::new(),
            cached: HashMap::new(),
            hash_of: vec![None; num_blocks],
            prefix_caching,
            stats: PrefixStats::default(),
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks that a new allocation can take (free or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn used(&self) -> usize {
        self.num_blocks() - self.available()
    }

    /// The fraction of blocks in use (1 is full).
    pub fn usage(&self) -> f64 {
        self.used() as f64 / self.num_blocks().max(1) as f64
    }

    /// Prefix-cache counters.
    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        parent.hash(&mut hasher);
        tokens.hash(&mut hasher);
        hasher.finish()
    }

    /// Starts a sequence whose prompt is `prompt`: takes the cached blocks
    /// of its longest cached prefix (always leaving at least one token to
    /// compute, for its logits). Returns the blocks, how many prompt tokens
    /// they already hold, and the lookup's blocks queried and found, which
    /// count in [`Self::stats`] once the sequence is admitted
    /// ([`Self::count_lookup`]): a sequence that does not fit gives its
    /// blocks back and looks up again when it retries.
    pub fn start_sequence(&mut self, prompt: &[u32]) -> (SequenceBlocks, usize, PrefixStats) {
        let mut seq = SequenceBlocks::default();
        let mut lookup = PrefixStats::default();
        if !self.prefix_caching || prompt.len() <= 1 {
            return (seq, 0, lookup);
        }
        let full = (prompt.len() - 1) / self.block_size;
        let mut parent = None;
        for chunk in prompt.chunks_exact(self.block_size).take(full) {
            let hash = Self::hash_block(parent, chunk);
            lookup.queries += 1;
            let Some(&block) = self.cached.get(&hash) else {
                break;
            };
            lookup.hits += 1;
            if self.ref_counts[block as usize] == 0 {
                self.evictable.retain(|&b| b != block);
            }
            self.ref_counts[block as usize] += 1;
            seq.blocks.push(block);
            seq.hashes.push(hash);
            parent = Some(hash);
        }
        let cached_tokens = seq.blocks.len() * self.block_size;
        (seq, cached_tokens, lookup)
    }

    /// Counts an admitted sequence's prefix lookup in [`Self::stats`].
    pub fn count_lookup(&mut self, lookup: PrefixStats) {
        self.stats.queries += lookup.queries;
        self.stats.hits += lookup.hits;
    }

    /// Makes room for `tokens` positions in `seq`, allocating blocks.
    pub fn reserve(&mut self, seq: &mut SequenceBlocks, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_for(tokens).saturating_sub(seq.blocks.len());
        if needed > self.available() {
            return Err(OutOfBlocks {
                needed,
                free: self.available(),
            });
        }
        for _ in 0..needed {
            let block = match self.free.pop() {
                Some(block) => block,
                None => {
                    let block = self.evictable.pop_front().expect("counted as available");
                    if let Some(hash) = self.hash_of[block as usize].take() {
                        self.cached.remove(&hash);
                    }
                    block
                }
            };
            self.ref_counts[block as usize] = 1;
            seq.blocks.push(block);
        }
        Ok(())
    }

    /// Registers the full blocks of `seq` whose `tokens` (the sequence so far)
    /// are now computed, so later requests can share them.
    pub fn commit(&mut self, seq: &mut SequenceBlocks, tokens: &[u32], computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let full = computed.min(tokens.len()) / self.block_size;
        while seq.hashes.len() < full.min(seq.blocks.len()) {
            let i = seq.hashes.len();
            let parent = seq.hashes.last().copied();
            let hash = Self::hash_block(
                parent,
                &tokens[i * self.block_size..(i + 1) * self.block_size],
            );
            let block = seq.blocks[i];
            // Another sequence may have registered the same content first;
            // keep that one, this block simply stays private.
            if let std::collections::hash_map::Entry::Vacant(entry) = self.cached.entry(hash) {
                entry.insert(block);
                self.hash_of[block as usize] = Some(hash);
            }
            seq.hashes.push(hash);
        }
    }

    /// Releases `seq`'s blocks; cached ones stay reusable until evicted.
    pub fn release(&mut self, seq: SequenceBlocks) {
        for block in seq.blocks.into_iter().rev() {
            let count = &mut self.ref_counts[block as usize];
            *count -= 1;
            if *count == 0 {
                if self.hash_of[block as usize].is_some() {
                    self.evictable.push_back(block);
                } else {
                    self.free.push(block);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32) -> Vec<u32> {
        (100..100 + n).collect()
    }

    #[test]
    fn allocation_and_release_account_for_every_block() {
        let mut blocks = BlockManager::new(8, 4, false);
        let (mut seq, cached, _) = blocks.start_sequence(&tokens(10));
        assert_eq!(cached, 0);
        blocks.reserve(&mut seq, 10).unwrap();
        assert_eq!((seq.blocks.len(), blocks.used()), (3, 3));
        blocks.reserve(&mut seq, 12).unwrap();
        assert_eq!(seq.blocks.len(), 3, "12 positions still fit three blocks");
        let error = blocks.reserve(&mut seq, 40).unwrap_err();
        assert_eq!(error, OutOfBlocks { needed: 7, free: 5 });
        blocks.release(seq);
        assert_eq!(blocks.used(), 0);
    }

    #[test]
    fn a_shared_prefix_reuses_blocks_and_leaves_one_token_to_compute() {
        let mut blocks = BlockManager::new(16, 4, true);
        let prompt = tokens(10);
        let (mut first, _, lookup) = blocks.start_sequence(&prompt);
        blocks.reserve(&mut first, prompt.len()).unwrap();
        blocks.count_lookup(lookup);
        blocks.commit(&mut first, &prompt, prompt.len());

        // Same first 9 tokens: two full blocks (8 tokens) are shared.
        let mut other = prompt[..9].to_vec();
        other.push(7);
        let (mut second, cached, lookup) = blocks.start_sequence(&other);
        assert_eq!(cached, 8);
        assert_eq!(second.blocks, first.blocks[..2]);
        blocks.reserve(&mut second, other.len()).unwrap();
        blocks.count_lookup(lookup);
        assert_ne!(second.blocks[2], first.blocks[2]);
        // The first request looked up one block (a miss ends the lookup).
        assert_eq!(
            blocks.stats(),
            PrefixStats {
                queries: 3,
                hits: 2
            }
        );

        // An identical 8-token prompt keeps its last block to compute.
        let (_, cached, _) = blocks.start_sequence(&prompt[..8]);
        assert_eq!(cached, 4);
    }

    #[test]
    fn released_prefixes_stay_cached_until_their_space_is_needed() {
        let mut blocks = BlockManager::new(4, 4, true);
        let prompt = tokens(9);
        let (mut seq, _, _) = blocks.start_sequence(&prompt);
        blocks.reserve(&mut seq, 9).unwrap();
        blocks.commit(&mut seq, &prompt, 9);
        blocks.release(seq);
        assert_eq!(blocks.used(), 0);
        let (seq, cached, _) = blocks.start_sequence(&prompt);
        assert_eq!(cached, 8, "still cached after release");
        blocks.release(seq);

        // A different request needs all four blocks: the cache is evicted.
        let other = tokens(16).iter().map(|t| t + 1000).collect::<Vec<_>>();
        let (mut big, _, _) = blocks.start_sequence(&other);
        blocks.reserve(&mut big, 16).unwrap();
        blocks.release(big);
        let (_, cached, _) = blocks.start_sequence(&prompt);
        assert_eq!(cached, 0, "evicted");
    }

    #[test]
    fn prefix_caching_can_be_turned_off() {
        let mut blocks = BlockManager::new(8, 4, false);
        let prompt = tokens(9);
        let (mut seq, _, _) = blocks.start_sequence(&prompt);
        blocks.reserve(&mut seq, 9).unwrap();
        blocks.commit(&mut seq, &prompt, 9);
        blocks.release(seq);
        assert_eq!(blocks.start_sequence(&prompt).1, 0);
    }
}
