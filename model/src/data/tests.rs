use super::*;

fn idx(n: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut images = Vec::new();
    for v in [2051u32, n as u32, rows as u32, cols as u32] {
        images.extend_from_slice(&v.to_be_bytes());
    }
    images.extend((0..n * rows * cols).map(|i| (i % 256) as u8));
    let mut labels = Vec::new();
    labels.extend_from_slice(&2049u32.to_be_bytes());
    labels.extend_from_slice(&(n as u32).to_be_bytes());
    labels.extend((0..n).map(|i| (i % 10) as u8));
    (images, labels)
}

#[test]
fn parses_idx_and_rejects_bad_files() {
    let (images, labels) = idx(5, 2, 3);
    let d = Dataset::from_idx(&images, &labels).expect("valid");
    assert_eq!((d.len(), d.features(), d.classes()), (5, 6, 5));
    assert_eq!(d.values(), &Values::U8((0..30).collect()));
    assert_eq!(d.shape(), Shape::new(1, 2, 3));

    assert!(Dataset::from_idx(&images[..10], &labels).is_err());
    assert!(Dataset::from_idx(&images[..images.len() - 1], &labels).is_err());
    assert!(Dataset::from_idx(&labels, &images).is_err());
    let (other_images, _) = idx(4, 2, 3);
    assert!(Dataset::from_idx(&other_images, &labels).is_err());
}

#[test]
fn split_is_seeded_and_a_partition() {
    let (images, labels) = idx(50, 1, 1);
    let d = Dataset::from_idx(&images, &labels).expect("valid");
    let (a, b) = d.shuffled_split(1, 40);
    assert_eq!((a.len(), b.len()), (40, 10));
    assert_eq!(d.shuffled_split(1, 40), (a.clone(), b.clone()));
    assert_ne!(d.shuffled_split(2, 40).0, a);
    let (Values::U8(a_px), Values::U8(b_px)) = (a.values(), b.values()) else {
        panic!("bytes stay bytes")
    };
    let mut all: Vec<u8> = a_px.iter().chain(b_px).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..50).collect::<Vec<u8>>());
}

#[test]
fn shards_cover_everything_once_and_differ_by_at_most_one() {
    for workers in 1..20 {
        for len in [0, 1, 7, 8000] {
            let shards = assign_shards(workers, len);
            assert_eq!(shards.len(), workers);
            assert_eq!(shards[0].start, 0);
            assert_eq!(shards[workers - 1].end, len);
            assert!(shards.windows(2).all(|w| w[0].end == w[1].start));
            let sizes: Vec<_> = shards.iter().map(|r| r.len()).collect();
            assert!(sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0) <= 1);
        }
    }
}

#[test]
fn batches_walk_the_shard_and_wrap() {
    assert_eq!(batch_positions(10, 0, 4).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(batch_positions(10, 2, 4).collect::<Vec<_>>(), [8, 9, 0, 1]);
    assert_eq!(batch_positions(3, 5, 4).collect::<Vec<_>>(), [2, 0, 1]);
    assert_eq!(batch_positions(0, 5, 4).count(), 0);
    assert_eq!(batch_positions(7, u64::MAX, 3).count(), 3);
}

#[test]
fn batch_scales_pixels_to_unit_range() {
    let d = Dataset::new(2, vec![0, 255, 51, 102], vec![3, 4]).expect("valid");
    let (x, y) = d.batch([1, 0]);
    assert_eq!(x, ndarray::array![[0.2, 0.4], [0.0, 1.0]]);
    assert_eq!(y, [4, 3]);
    assert!(Dataset::new(2, vec![0], vec![1]).is_err());
}

#[test]
fn f32_features_are_standardised_per_feature() {
    let values = vec![1.0, 10.0, 3.0, 30.0, 5.0, 20.0];
    let norm = Normalization::fit(&values, 2);
    assert_eq!(norm.mean(), [3.0, 20.0]);
    let d = Dataset::from_parts(Shape::flat(2), Values::F32(values), vec![0, 1, 0], norm)
        .expect("valid");
    let (x, _) = d.batch([0, 2]);
    let s0 = (8.0f32 / 3.0).sqrt();
    let s1 = (200.0f32 / 3.0).sqrt();
    assert!((x[[0, 0]] + 2.0 / s0).abs() < 1e-6 && (x[[1, 1]]).abs() < 1e-6);
    assert!((x[[0, 1]] + 10.0 / s1).abs() < 1e-5);
    // A constant feature gets std 1 instead of a division by zero.
    assert_eq!(Normalization::fit(&[2.0, 2.0], 1).std(), [1.0]);
    let bad = Normalization::new(vec![0.0], vec![0.0]);
    assert_eq!(
        Dataset::new(1, vec![1], vec![0])
            .expect("ok")
            .with_normalization(bad),
        Err(ModelError::BadNormalization)
    );
    let wrong_len = Normalization::new(vec![0.0; 3], vec![1.0; 3]);
    assert!(Dataset::new(2, vec![1, 2], vec![0])
        .expect("ok")
        .with_normalization(wrong_len)
        .is_err());
}
