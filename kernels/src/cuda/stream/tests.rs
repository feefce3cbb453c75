use super::*;

#[test]
fn fingerprint_sees_changes_anywhere_in_small_inputs() {
    let a = vec![1.0f32; 1000];
    let mut b = a.clone();
    b[517] = 1.5;
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&b)));
    assert_eq!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&a.clone())));
}

#[test]
fn fingerprint_samples_large_inputs_including_the_tail() {
    let a: Vec<u32> = (0..1_000_000).collect();
    let mut b = a.clone();
    *b.last_mut().unwrap() += 1;
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&b)));
    let c: Vec<u32> = a.iter().map(|x| x + 1).collect();
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&c)));
}

#[test]
fn grid_covers_every_item() {
    let c = grid_1d(1000, 256);
    assert_eq!(c.grid_dim.0, 4);
    assert_eq!(grid_1d(0, 256).grid_dim.0, 1);
}

#[test]
fn run_cache_keeps_what_is_used_and_drops_the_least_recent() {
    let key = |tag| RunKey {
        owner: 0,
        tag,
        ptr: 64,
        len: 8,
        print: 0,
    };
    let cache = RunCache::default();
    let first: Vec<_> = (0..RunCache::CAPACITY as u64)
        .map(|tag| cache.entry(key(tag)))
        .collect();
    // Used again (as a model's weights are by every batch): now the most
    // recent, so the next new entry pushes out tag 1, not tag 0.
    assert!(Arc::ptr_eq(&cache.entry(key(0)), &first[0]));
    cache.entry(key(100));
    assert!(Arc::ptr_eq(&cache.entry(key(0)), &first[0]));
    assert!(Arc::ptr_eq(&cache.entry(key(2)), &first[2]));
    assert!(
        !Arc::ptr_eq(&cache.entry(key(1)), &first[1]),
        "tag 1 was dropped"
    );
}
