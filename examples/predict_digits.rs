//! Load the digits CNN that `examples/train_digits.py` exports and report its accuracy on the
//! test images the script saved next to it, with no Python at run time.
//!
//!     python examples/train_digits.py                  # writes model/digits-*
//!     cargo run --release --example predict_digits     # or: -- PREFIX

use std::path::Path;
use std::time::Instant;

use oxnet::params::ArgReduceParams;
use oxnet::{ops, Context, Model, NDArray};

/// Images per `predict` call: the 360 test images run as a batch of 256 and one of 104, so the
/// model also rebinds for a second batch size.
const BATCH_SIZE: usize = 256;

/// The files `train_digits.py` writes for `prefix`.
pub fn exported_files(prefix: &str) -> [String; 3] {
    [format!("{prefix}-symbol.json"), format!("{prefix}-0000.params"), format!("{prefix}-test.params")]
}

/// The array saved under `key` in a `.params` file.
fn saved_array(arrays: &[NDArray], names: &[String], key: &str, file: &str) -> oxnet::Result<NDArray> {
    let index =
        names.iter().position(|n| n == key).ok_or_else(|| oxnet::Error::new(oxnet::ErrorKind::Io, format!("{file} holds no array '{key}'")))?;
    Ok(arrays[index].clone())
}

/// Accuracy of the model exported under `prefix` on its saved test split, and the number of
/// test images.
pub fn test_accuracy(prefix: &str) -> oxnet::Result<(f64, usize)> {
    let cpu = Context::cpu(0);
    let mut model = Model::load_checkpoint(prefix, 0, cpu)?;
    let test_file = format!("{prefix}-test.params");
    let (arrays, names) = oxnet::io::params::load(Path::new(&test_file))?;
    let images = saved_array(&arrays, &names, "data", &test_file)?;
    let labels = saved_array(&arrays, &names, "label", &test_file)?.to_vec::<f32>()?;
    let count = images.shape()[0];
    let mut correct = 0;
    for begin in (0..count).step_by(BATCH_SIZE) {
        let end = (begin + BATCH_SIZE).min(count);
        let batch = images.slice_rows(begin, end)?;
        let scores = &model.predict(&[("data", &batch)])?[0];
        let predicted = ops::argmax(scores, ArgReduceParams::new().axis(Some(1)))?.to_vec::<f32>()?;
        correct += predicted.iter().zip(&labels[begin..end]).filter(|(p, l)| p == l).count();
    }
    Ok((correct as f64 / count as f64, count))
}

fn main() -> oxnet::Result<()> {
    let prefix = std::env::args().nth(1).unwrap_or_else(|| "model/digits".to_string());
    if let Some(missing) = exported_files(&prefix).into_iter().find(|f| !Path::new(f).exists()) {
        eprintln!("{missing} not found: run `python examples/train_digits.py` first (or pass the prefix it exported to)");
        std::process::exit(2);
    }
    let start = Instant::now();
    let (accuracy, count) = test_accuracy(&prefix)?;
    println!("{prefix}: accuracy {accuracy:.4} on {count} test images ({:.1} ms, loading included)", start.elapsed().as_secs_f64() * 1e3);
    Ok(())
}
