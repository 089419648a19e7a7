//! The SHA-256 of a file through mediaonce's hashing path
//! (`fingerprint::ContentHasher`, as probe's `verify` and the manifest's
//! entries use it), read in 1 MiB chunks as S3 bodies and the outputs'
//! files are: for `bench/sha256.sh`.
//!
//!     sha256 FILE      prints "<hex>  FILE" and the bytes hashed

use std::io::Read;
use std::process::ExitCode;

use mediaonce::fingerprint::ContentHasher;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: sha256 FILE");
        return ExitCode::from(2);
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("sha256: cannot open {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut hasher = ContentHasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) => {
                eprintln!("sha256: reading {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let size = hasher.size();
    println!("{}  {path}", hasher.finish());
    eprintln!("{size} bytes");
    ExitCode::SUCCESS
}
