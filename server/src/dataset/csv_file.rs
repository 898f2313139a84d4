//! A CSV file: a header row, one integer `label` column, every other column a number.
//! Labels may be any integers; they are mapped to classes in ascending order and kept as
//! the class names.

use std::collections::BTreeMap;
use std::path::Path;

use model::{Dataset, Normalization, Shape, Values};

use super::{DataError, Loaded, MAX_CLASSES};

pub(super) fn load(path: &Path) -> Result<Loaded, DataError> {
    let fail = |reason: String| DataError::at(path, reason);
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| fail(e.to_string()))?;
    let header = reader.headers().map_err(|e| fail(e.to_string()))?.clone();
    let label_col = header
        .iter()
        .position(|h| h == "label")
        .ok_or_else(|| fail("line 1: the header has no `label` column".into()))?;
    let features = header.len() - 1;
    if features == 0 {
        return Err(fail(
            "line 1: the header has no feature columns besides `label`".into(),
        ));
    }
    let mut values = Vec::new();
    let mut raw_labels: Vec<i64> = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(fail(e.to_string())),
        }
        let line = record.position().map_or(0, |p| p.line());
        if record.len() == 1 && record[0].is_empty() {
            continue; // a blank line
        }
        if record.len() != header.len() {
            return Err(fail(format!(
                "line {line}: {} fields, but the header has {}",
                record.len(),
                header.len()
            )));
        }
        for (col, field) in record.iter().enumerate() {
            if col == label_col {
                let label = field
                    .parse::<i64>()
                    .map_err(|_| fail(format!("line {line}: label `{field}` is not an integer")))?;
                raw_labels.push(label);
            } else {
                match field.parse::<f32>() {
                    Ok(v) if v.is_finite() => values.push(v),
                    _ => {
                        return Err(fail(format!(
                            "line {line}, column `{}`: `{field}` is not a finite number",
                            &header[col]
                        )))
                    }
                }
            }
        }
    }
    if raw_labels.is_empty() {
        return Err(fail("no data rows after the header".into()));
    }
    let classes: BTreeMap<i64, u8> = {
        let mut distinct: Vec<i64> = raw_labels.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() > MAX_CLASSES {
            return Err(fail(format!(
                "{} distinct labels; at most {MAX_CLASSES} classes are supported",
                distinct.len()
            )));
        }
        distinct.into_iter().zip(0..=u8::MAX).collect()
    };
    let labels = raw_labels.iter().map(|l| classes[l]).collect();
    let data = Dataset::from_parts(
        Shape::flat(features),
        Values::F32(values),
        labels,
        Normalization::new(vec![0.0], vec![1.0]),
    )?;
    Ok(Loaded {
        data,
        classes: classes.keys().map(ToString::to_string).collect(),
    })
}
