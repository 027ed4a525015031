//! The checked-in header is what cbindgen generates from the source now.

use std::path::Path;

#[test]
fn header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    // cbindgen follows the `mod` items from the crate root.
    let builder = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"));
    let mut generated = Vec::new();
    builder
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = crate_dir.join("include/hetsched.h");
    if std::env::var_os("HETSCHED_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "capi/include/hetsched.h is stale: run `HETSCHED_BLESS_HEADER=1 cargo test -p hetsched-capi --test header` and commit it"
    );
}
