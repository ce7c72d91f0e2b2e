//! The scheduler's plans, step by step.

use super::*;

fn scheduler(blocks: usize, batch: usize, budget: usize) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_batch_size: batch,
            max_batch_tokens: budget,
            max_seq_len: 1000,
        },
        BlockManager::new(blocks, 4, true),
    )
}

fn run(s: &mut Scheduler, batch: &Batch, next: u32) {
    s.complete(batch);
    for seq in &batch.seqs {
        if seq.wants_logits {
            s.append_token(seq.id, next);
        }
    }
}

#[test]
fn prompts_are_chunked_under_the_token_budget_and_decodes_join() {
    let mut s = scheduler(32, 8, 6);
    s.add(1, (0..10).collect(), 4).unwrap();
    let b = s.schedule();
    assert_eq!(
        (
            b.seqs[0].start,
            b.seqs[0].tokens.len(),
            b.seqs[0].wants_logits
        ),
        (0, 6, false)
    );
    run(&mut s, &b, 99);
    s.add(2, (50..53).collect(), 4).unwrap();
    let b = s.schedule();
    // The rest of 1's prompt, then 2's whole prompt within the budget of 6.
    assert_eq!(
        b.seqs
            .iter()
            .map(|q| (q.id, q.start, q.tokens.len(), q.wants_logits))
            .collect::<Vec<_>>(),
        [(1, 6, 4, true), (2, 0, 2, false)]
    );
    run(&mut s, &b, 99);
    let b = s.schedule();
    assert_eq!(
        b.seqs
            .iter()
            .map(|q| (q.id, q.start, q.tokens.clone()))
            .collect::<Vec<_>>(),
        [(1, 10, vec![99]), (2, 2, vec![52])]
    );
}

#[test]
fn drafts_follow_a_decoding_sequence_and_count_once_verified() {
    let mut s = scheduler(32, 8, 100);
    s.add(1, vec![1, 2, 3], 10).unwrap();
    // A sequence in its prompt takes no drafts.
    assert!(!s.propose(1, |_| vec![9]));
    let b = s.schedule();
    assert!(
        !s.propose(1, |_| vec![9]),
        "not before its prompt is computed"
    );
    run(&mut s, &b, 4);
    assert!(s.propose(1, |tokens| {
        assert_eq!(tokens, [1, 2, 3, 4], "its prompt and output");
        vec![5, 6, 7]
    }));
    let b = s.schedule();
    let q = &b.seqs[0];
    assert_eq!(
        (q.start, q.tokens.clone(), q.drafts, q.wants_logits),
        (3, vec![4, 5, 6, 7], 3, true)
    );
    // Each fed token is a decode row of its own, one position further, on
    // the sequence's blocks.
    let step = b.step_batch();
    assert!(!step.all_logits);
    assert_eq!(
        step.sequences
            .iter()
            .map(|f| (f.tokens.clone(), f.start, f.context_len(), f.wants_logits))
            .collect::<Vec<_>>(),
        [
            (vec![4], 3, 4, true),
            (vec![5], 4, 5, true),
            (vec![6], 5, 6, true),
            (vec![7], 6, 7, true)
        ]
    );
    assert!(step.sequences.iter().all(|f| f.blocks == q.blocks));
    // The model kept 5 and picked 8 after it: 5's cache entry counts,
    // 6's and 7's do not, and 8 is fed next.
    s.complete(&b);
    s.append_verified(1, 5);
    s.append_token(1, 8);
    let b = s.schedule();
    assert_eq!(
        (b.seqs[0].start, b.seqs[0].tokens.clone(), b.seqs[0].drafts),
        (5, vec![8], 0)
    );
    assert_eq!(b.step_batch().sequences.len(), 1, "drafts are fed once");
}

#[test]
fn drafts_fit_the_token_budget_and_give_way_to_other_sequences_in_the_cache() {
    // Blocks of 4; the budget cuts the drafts.
    let mut s = scheduler(32, 8, 3);
    s.add(1, vec![1, 2], 10).unwrap();
    let b = s.schedule();
    run(&mut s, &b, 3);
    s.propose(1, |_| vec![4, 5, 6, 7]);
    let b = s.schedule();
    assert_eq!(
        (b.seqs[0].tokens.clone(), b.seqs[0].drafts),
        (vec![3, 4, 5], 2)
    );
    // Two blocks: each sequence holds one; drafts that would need a
    // third block are dropped rather than preempting the other.
    let mut s = scheduler(2, 8, 100);
    s.add(1, vec![1, 2], 4).unwrap();
    s.add(2, vec![1, 2], 4).unwrap();
    let b = s.schedule();
    run(&mut s, &b, 3);
    s.propose(1, |_| vec![4, 5]);
    s.propose(2, |_| vec![4]);
    let b = s.schedule();
    assert_eq!(
        b.seqs
            .iter()
            .map(|q| (q.id, q.tokens.clone(), q.drafts))
            .collect::<Vec<_>>(),
        [(1, vec![3], 0), (2, vec![3, 4], 1)]
    );
    assert_eq!(s.preemptions(), 0);
}

#[test]
fn every_sequence_finishes_in_a_small_cache_with_shared_prefixes() {
    // 24 blocks of 4 for 11 sequences of up to 61 positions whose
    // prompts share prefixes: preempted sequences come back to find
    // their prefix cached. Sequences that waited holding cached blocks
    // once filled the cache with none running, and the engine spun.
    let mut s = scheduler(24, 8, 64);
    let mut left = HashMap::new();
    for id in 0..11u64 {
        let (seed, period) = (id as u32 % 4, 3 + id as u32 % 4);
        let prompt: Vec<u32> = (0..9 + 4 * (id as u32 % 4))
            .map(|j| seed * 97 + (j % period) * 31)
            .collect();
        s.add(id, prompt.clone(), 40).unwrap();
        left.insert(id, 40);
    }
    for _ in 0..2000 {
        let b = s.schedule();
        assert!(
            !b.seqs.is_empty() || left.is_empty(),
            "nothing scheduled: {s:?}"
        );
        s.complete(&b);
        for seq in b.seqs.iter().filter(|q| q.wants_logits) {
            let n = left.get_mut(&seq.id).unwrap();
            *n -= 1;
            if *n == 0 {
                left.remove(&seq.id);
                s.remove(seq.id);
            } else {
                s.append_token(seq.id, 7);
            }
        }
        if left.is_empty() {
            break;
        }
    }
    assert!(left.is_empty(), "{} sequences left", left.len());
    assert!(s.preemptions() > 0, "the cache was small enough to preempt");
    assert_eq!(s.blocks().used(), 0);
}

#[test]
fn requests_queue_when_the_batch_is_full_and_leave_cleanly() {
    let mut s = scheduler(32, 1, 100);
    s.add(1, vec![1, 2], 2).unwrap();
    s.add(2, vec![3, 4], 2).unwrap();
    let b = s.schedule();
    assert_eq!(b.seqs.len(), 1);
    assert_eq!(s.num_waiting(), 1);
    run(&mut s, &b, 7);
    assert!(s.remove(1));
    let b = s.schedule();
    assert_eq!(b.seqs[0].id, 2);
    assert!(s.remove(2));
    assert!(!s.remove(2));
    assert_eq!(s.blocks().used(), 0, "no block leaks");
}

#[test]
fn a_request_with_many_sequences_shares_the_batch_with_later_ones() {
    let mut s = scheduler(64, 2, 100);
    for id in 0..6 {
        s.add_to_group(id, 100, vec![1, 2], 4).unwrap();
    }
    s.add_to_group(6, 200, vec![3, 4], 4).unwrap();
    // Request 200's one sequence gets the second slot, ahead of request
    // 100's other five, although they came first.
    let b = s.schedule();
    assert_eq!(b.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), [0, 6]);
    run(&mut s, &b, 7);
    s.remove(6);
    let b = s.schedule();
    assert_eq!(b.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), [0, 1]);
    run(&mut s, &b, 7);
    // A third request arrives: it goes before request 100's rest.
    s.add_to_group(7, 300, vec![5, 6], 4).unwrap();
    s.remove(0);
    let b = s.schedule();
    assert_eq!(b.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), [1, 7]);
}

#[test]
fn a_full_cache_preempts_the_newest_sequence_and_recomputes_it_later() {
    // 3 blocks of 4: two sequences of 4 tokens fit, then decode needs more.
    let mut s = scheduler(3, 8, 100);
    s.add(1, vec![1, 2, 3, 4], 4).unwrap();
    s.add(2, vec![5, 6, 7, 8], 4).unwrap();
    let b = s.schedule();
    assert_eq!(b.seqs.len(), 2);
    run(&mut s, &b, 9);
    // Both need a second block for position 4; only one is free.
    let b = s.schedule();
    assert_eq!(b.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), [1]);
    assert_eq!(s.preemptions(), 1);
    assert_eq!(s.num_waiting(), 1);
    run(&mut s, &b, 10);
    s.remove(1);
    // Sequence 2 comes back with its generated token and is recomputed
    // (its first block still in the prefix cache).
    let b = s.schedule();
    assert_eq!(
        (b.seqs[0].id, b.seqs[0].start, b.seqs[0].tokens.clone()),
        (2, 4, vec![9])
    );
    s.remove(2);
    assert_eq!(s.blocks().used(), 0);
}

#[test]
fn a_placeholder_is_fed_then_resolved_and_registered_only_once_known() {
    let mut s = scheduler(16, 8, 100);
    s.add(1, vec![1, 2, 3], 8).unwrap();
    s.add(2, vec![4, 5, 6], 8).unwrap();
    let b = s.schedule();
    s.complete(&b);
    // 1's pick is on the way; 2's pick on the way is its last.
    s.append_unresolved(1);
    let b = s.schedule();
    assert_eq!(
        b.seqs
            .iter()
            .map(|q| (q.id, q.tokens.clone(), q.feeds_unresolved))
            .collect::<Vec<_>>(),
        [(1, vec![UNRESOLVED_TOKEN], true)],
        "2 has nothing to feed"
    );
    // The block holding the placeholder is full after this step, but is
    // registered for prefix caching only once the pick is known.
    s.complete(&b);
    s.append_token(1, 7);
    s.append_unresolved(1);
    s.append_token(1, 8);
    s.remove(2);
    let b = s.schedule();
    assert_eq!(
        (b.seqs[0].tokens.clone(), b.seqs[0].feeds_unresolved),
        (vec![8], false)
    );
    s.complete(&b);
    // 1 waits for its last pick: nothing to feed. 3 finds [1, 2, 3, 7]
    // cached (with the placeholder registered, it would not).
    s.add(3, vec![1, 2, 3, 7, 8], 2).unwrap();
    let b = s.schedule();
    assert_eq!(
        b.seqs.iter().map(|q| (q.id, q.start)).collect::<Vec<_>>(),
        [(3, 4)]
    );
}

#[test]
fn impossible_requests_are_refused_up_front() {
    let mut s = scheduler(4, 8, 100);
    assert_eq!(s.add(1, vec![], 1), Err(AdmissionError::EmptyPrompt));
    assert!(matches!(
        s.add(1, vec![1; 10], 7),
        Err(AdmissionError::TooLong { limit: 16, .. })
    ));
    s.add(1, vec![1], 1).unwrap();
    assert_eq!(s.add(1, vec![1], 1), Err(AdmissionError::Duplicate(1)));
}

#[test]
fn scored_prompts_compute_every_position_in_chunks_of_their_own() {
    let mut s = scheduler(32, 8, 4);
    s.limit_scored_tokens(3);
    // A first request leaves [0..8) in the prefix cache.
    s.add(1, (0..10).collect(), 2).unwrap();
    for _ in 0..3 {
        let b = s.schedule();
        run(&mut s, &b, 99);
    }
    s.remove(1);
    s.add(2, (0..10).collect(), 2).unwrap();
    assert!(s.score_prompt(2));
    assert!(!s.score_prompt(7), "no such sequence");
    // Scored from position 0 despite the cache, 3 tokens at most, up to
    // the last prompt token, which goes as a plain step.
    let mut chunks = Vec::new();
    loop {
        let b = s.schedule();
        let q = &b.seqs[0];
        chunks.push((q.start, q.tokens.len(), q.scored, q.wants_logits));
        let last = q.wants_logits;
        run(&mut s, &b, 5);
        if last {
            break;
        }
    }
    let expected = [
        (0, 3, true, false),
        (3, 3, true, false),
        (6, 3, true, false),
        (9, 1, false, true),
    ];
    assert_eq!(chunks, expected);
    // Split off for their own step, with every row's logits.
    let mut s = scheduler(32, 8, 16);
    s.add(3, vec![4, 4, 4], 2).unwrap();
    s.add(4, vec![6, 6], 2).unwrap();
    assert!(s.score_prompt(4));
    let (scored, rest) = s.schedule().split_scored();
    let ids = |b: &Batch| b.seqs.iter().map(|q| q.id).collect::<Vec<_>>();
    assert_eq!((ids(&scored), ids(&rest)), (vec![4], vec![3]));
    let step = scored.step_batch();
    assert!(step.all_logits && step.sequences[0].wants_logits);
    assert!(!rest.step_batch().all_logits);
}

#[test]
fn a_sequence_that_waits_for_room_counts_its_prefix_lookup_once() {
    // 8 blocks of 4. Sequence 1 holds 5 (17 prompt tokens, then decodes).
    let mut s = scheduler(8, 8, 64);
    s.add(1, (0..17).collect(), 8).unwrap();
    let b = s.schedule();
    run(&mut s, &b, 99);
    let before = s.blocks().stats();
    // Sequence 2 shares its first 8 tokens (two cached blocks) and needs 6
    // blocks, 4 of them new where 3 or fewer are free: it waits while sequence 1
    // runs, looking its prefix up at every try.
    let prompt: Vec<u32> = (0..8).chain(100..116).collect();
    s.add(2, prompt, 4).unwrap();
    for _ in 0..3 {
        let b = s.schedule();
        assert_eq!(b.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), [1]);
        run(&mut s, &b, 99);
    }
    assert_eq!(s.blocks().stats(), before, "nothing counted while it waits");
    s.remove(1);
    let b = s.schedule();
    assert_eq!((b.seqs[0].id, b.seqs[0].start), (2, 8));
    let after = s.blocks().stats();
    // Its lookup once: the two shared blocks found, the third missed (a
    // miss ends the lookup).
    assert_eq!(
        (after.queries - before.queries, after.hits - before.hits),
        (3, 2)
    );
}
