//! The etcd store's gRPC code is generated from `proto/etcd.proto` and
//! checked in, so that building leasehold needs no protobuf compiler. This
//! test regenerates it (with Debian's `protoc`, which `./scripts/test`
//! installs) and fails if the checked-in file differs.

use std::path::Path;

const CHECKED_IN: &str = "src/store/etcd/etcdserverpb.rs";
/// Set to rewrite the checked-in file after changing the proto.
const WRITE: &str = "LEASEHOLD_WRITE_ETCD_API";

#[test]
fn generated_code_matches_the_proto() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().expect("temp dir");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out.path())
        .compile_protos(
            &[crate_dir.join("proto/etcd.proto")],
            &[crate_dir.join("proto")],
        )
        .expect("protoc compiles proto/etcd.proto (is protobuf-compiler installed?)");
    let generated =
        std::fs::read_to_string(out.path().join("etcdserverpb.rs")).expect("generated file");
    let checked_in_path = crate_dir.join(CHECKED_IN);
    if std::env::var_os(WRITE).is_some() {
        std::fs::write(&checked_in_path, &generated).expect("write the checked-in file");
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{CHECKED_IN} is not what proto/etcd.proto generates; rerun this test with {WRITE}=1 and commit the result"
    );
}
