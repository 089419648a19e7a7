//! The structural similarity of two images of the same size, for
//! `bench/thumbnail.sh`:
//!
//!     ssim REFERENCE CANDIDATE
//!
//! Prints the mean SSIM of their luma (BT.601 weights on the 8-bit values
//! as stored), by the tests' implementation (`tests/common/ssim.rs`: the
//! paper's window and constants).

use std::process::ExitCode;

#[path = "../tests/common/ssim.rs"]
mod ssim;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [reference, candidate] = args.as_slice() else {
        eprintln!("usage: ssim REFERENCE CANDIDATE");
        return ExitCode::from(2);
    };
    let result = luma(reference).and_then(|a| {
        let b = luma(candidate)?;
        ssim::ssim(&a, &b).map_err(|problem| format!("{reference} and {candidate}: {problem}"))
    });
    match result {
        Ok(score) => {
            println!("{score:.5}");
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("ssim: {problem}");
            ExitCode::FAILURE
        }
    }
}

fn luma(path: &str) -> Result<ssim::Plane, String> {
    let image = image::open(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(ssim::Plane::luma(&image.to_rgb8()))
}
