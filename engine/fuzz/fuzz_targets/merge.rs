//! The merge every mutation is made of, on arbitrary JSON: never a panic, and idempotent (a
//! second merge of the same patch changes nothing), which reinvocation relies on.
#![no_main]

use gatehouse_engine::merge;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // Two JSON documents separated by a NUL byte: the target and the patch.
    let Some(split) = data.iter().position(|b| *b == 0) else { return };
    let (Ok(target), Ok(patch)) = (
        serde_json::from_slice::<Value>(&data[..split]),
        serde_json::from_slice::<Value>(&data[split + 1..]),
    ) else {
        return;
    };
    for overwrite in [false, true] {
        let mut once = target.clone();
        merge(&mut once, &patch, overwrite);
        let mut twice = once.clone();
        merge(&mut twice, &patch, overwrite);
        assert_eq!(once, twice, "merge is not idempotent (overwrite={overwrite})");
    }
});
