//! Round trips and hostile-input properties of every message: encoding then
//! decoding gives the message back with a verifying MAC; every truncation
//! of a valid message is an error and never a panic; arbitrary bytes and
//! bit flips never panic.

use crate::support;

use ec_protocol::mac::{verify_request_mac, verify_response_mac};
use ec_protocol::*;
use proptest::prelude::*;
use support::gen::SECRET;

const REQ_MAC: [u8; 16] = [7; 16];

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn cb() -> impl Strategy<Value = Cb> {
    prop_oneof![Just(Cb::Same), bytes(40).prop_map(Cb::Delta), bytes(40).prop_map(Cb::Literal)]
}

fn doc() -> impl Strategy<Value = DocKey> {
    (1u8..=4, proptest::collection::vec(any::<u8>(), 1..20), proptest::collection::vec(any::<u8>(), 1..20))
        .prop_map(|(p, account, reference)| DocKey { provider: Provider::from_u8(p).unwrap(), account, reference })
}

fn header() -> impl Strategy<Value = RequestHeader> {
    (any::<[u8; 8]>(), 1u64.., any::<[u8; 8]>(), proptest::option::of(any::<[u8; 8]>()))
        .prop_map(|(session_id, seq, request_id, resp_ref)| RequestHeader { session_id, seq, request_id, resp_ref })
}

fn ctx_def() -> impl Strategy<Value = CtxDef> {
    (any::<u64>(), bytes(60), bytes(30), proptest::option::of(doc())).prop_map(|(ctx_id, head, body, doc)| CtxDef {
        ctx_id,
        head,
        body,
        doc,
    })
}

fn spec() -> impl Strategy<Value = RequestSpec> {
    let body = prop_oneof![
        Just(BodySpec::Empty),
        any::<u64>().prop_map(|item| BodySpec::File { item }),
        cb().prop_map(|bytes| BodySpec::Bytes { bytes }),
        (any::<u64>(), cb(), any::<u64>()).prop_map(|(item, bytes, split)| BodySpec::Wrapped { item, bytes, split }),
    ];
    (any::<u64>(), cb(), body).prop_map(|(ctx_id, head, body)| RequestSpec { ctx_id, head, body })
}

fn item() -> impl Strategy<Value = Item> {
    let payload = prop_oneof![Just(Payload::Full), (0u64..=64 << 20).prop_map(|payload_len| Payload::Patch { payload_len })];
    (proptest::option::of(doc()), bytes(128), payload, 0u64..=2 << 30, any::<[u8; 32]>())
        .prop_map(|(doc, binding, payload, target_size, target_sha256)| Item { doc, binding, payload, target_size, target_sha256 })
}

fn save() -> impl Strategy<Value = Save> {
    (
        header(),
        0u8..=5,
        proptest::collection::vec(ctx_def(), 0..3),
        proptest::collection::vec(spec(), 0..3),
        proptest::collection::vec(item(), 1..4),
    )
        .prop_map(|(header, p, ctx_defs, requests, items)| Save {
            header,
            procedure: Procedure::from_u8(p).unwrap(),
            ctx_defs,
            requests,
            items,
        })
}

fn fetch() -> impl Strategy<Value = Fetch> {
    (
        header(),
        any::<bool>(),
        proptest::collection::vec(ctx_def(), 0..3),
        spec(),
        proptest::option::of(doc()),
        proptest::option::of(any::<[u8; 32]>()),
    )
        .prop_map(|(header, follow_redirect, ctx_defs, request, doc, have_sha256)| Fetch {
            header,
            follow_redirect,
            ctx_defs,
            request,
            doc,
            have_sha256,
        })
}

fn flags(replayed: bool) -> impl Strategy<Value = ResultFlags> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(move |(r, u, h)| ResultFlags {
        replayed: r && replayed,
        ref_used: u,
        hash_disagreement: h,
    })
}

fn fetch_result() -> impl Strategy<Value = FetchResult> {
    let last = prop_oneof![
        cb().prop_map(FetchBody::Inline),
        (0u64..1000, any::<[u8; 32]>(), 0u64..1000).prop_map(|(target_size, target_sha256, payload_len)| FetchBody::Patch {
            target_size,
            target_sha256,
            payload_len
        }),
        (0u64..1000, any::<[u8; 32]>()).prop_map(|(target_size, target_sha256)| FetchBody::Full { target_size, target_sha256 }),
    ];
    let part0 = (cb(), cb()).prop_map(|(head, body)| FetchPart { head, body: FetchBody::Inline(body) });
    (flags(false), proptest::option::of(part0), cb(), last)
        .prop_map(|(flags, p0, head, body)| FetchResult { flags, parts: p0.into_iter().chain([FetchPart { head, body }]).collect() })
}

fn error_message() -> impl Strategy<Value = ErrorMessage> {
    (0u8..=1, 1u8..=24, 0u8..=1, any::<u64>(), proptest::collection::vec(any::<u64>(), 0..5), "[a-z_]{0,32}", "\\PC{0,60}")
        .prop_filter("detail within 256 bytes", |t| t.6.len() <= 256)
        .prop_map(|(version, c, stage, retry_after_ms, list, cause, detail)| ErrorMessage {
            version,
            code: ErrorCode::from_number(c).unwrap(),
            stage,
            retry_after_ms,
            list,
            cause,
            detail,
        })
}

/// Every proper prefix of `bytes` fails to decode (and never panics).
fn all_truncations_fail<T: std::fmt::Debug>(bytes: &[u8], decode: impl Fn(&[u8]) -> Result<T>) {
    for n in 0..bytes.len() {
        assert!(decode(&bytes[..n]).is_err(), "a message cut to {n} of {} bytes decoded", bytes.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn save_round_trips(m in save()) {
        let l = Limits::default();
        let payload_total = m.payload_total();
        // Payloads are not read by decode; give it the structured part only and check the split separately.
        let bytes = m.encode(&SECRET);
        let (back, f) = Save::decode(&bytes, &l).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert!(verify_request_mac(&SECRET, PATH_SAVE, f.s(&bytes), &f.mac));
        prop_assert_eq!(f.payload_offset, bytes.len());
        if payload_total < 4096 {
            let payloads = vec![0u8; payload_total as usize];
            prop_assert_eq!(back.split_payloads(&payloads).unwrap().len(), m.items.len());
            prop_assert!(back.split_payloads(&payloads[..payloads.len().saturating_sub(1)]).is_err() || payload_total == 0);
        }
        all_truncations_fail(&bytes, |b| Save::decode(b, &l));
    }

    #[test]
    fn fetch_round_trips(m in fetch()) {
        let l = Limits::default();
        let bytes = m.encode(&SECRET);
        let (back, f) = Fetch::decode(&bytes, &l).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert!(verify_request_mac(&SECRET, PATH_FETCH, f.s(&bytes), &f.mac));
        all_truncations_fail(&bytes, |b| Fetch::decode(b, &l));
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(Fetch::decode(&longer, &l).unwrap_err().code, ErrorCode::Malformed);
    }

    #[test]
    fn hello_and_hello_ok_round_trip(key_id in any::<u64>(), nonce in any::<[u8; 16]>(), caps in any::<u64>(), label in "\\PC{0,16}",
                                     limits in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..64), sid in any::<[u8; 8]>()) {
        let l = Limits::default();
        let h = Hello { key_id, device_nonce: nonce, versions: vec![3, 1], patch_versions: vec![1], caps, label };
        let bytes = h.encode(&SECRET);
        let (back, f) = Hello::decode(&bytes, &l).unwrap();
        prop_assert_eq!(&back, &h);
        prop_assert!(verify_request_mac(&SECRET, PATH_HELLO, f.s(&bytes), &f.mac));
        all_truncations_fail(&bytes, |b| Hello::decode(b, &l));
        let ok = HelloOk { chosen_version: 1, session_id: sid, caps, patch_versions: vec![2, 1], limits };
        let bytes = ok.encode(&SECRET, &REQ_MAC);
        let (back, f) = HelloOk::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &ok);
        prop_assert!(verify_response_mac(&SECRET, &REQ_MAC, f.s(&bytes), &f.mac));
        all_truncations_fail(&bytes, HelloOk::decode);
    }

    #[test]
    fn results_and_errors_round_trip(f in flags(true), head in cb(), body in cb(), fr in fetch_result(), e in error_message()) {
        let l = Limits::default();
        let sr = SaveResult { flags: f, head, body };
        let bytes = sr.encode(&SECRET, &REQ_MAC);
        let (back, fr_) = SaveResult::decode(&bytes, &l).unwrap();
        prop_assert_eq!(&back, &sr);
        prop_assert!(verify_response_mac(&SECRET, &REQ_MAC, fr_.s(&bytes), &fr_.mac));
        all_truncations_fail(&bytes, |b| SaveResult::decode(b, &l));

        let bytes = fr.encode(&SECRET, &REQ_MAC);
        let (back, framing) = FetchResult::decode(&bytes, &l).unwrap();
        prop_assert_eq!(&back, &fr);
        let want = fr.parts.last().unwrap().body.payload_len() as usize;
        let payload = vec![1u8; want];
        prop_assert_eq!(back.payload(&payload).unwrap().len(), want);
        prop_assert!(back.payload(&[&payload[..], &[0]].concat()).is_err());
        prop_assert_eq!(framing.payload_offset, bytes.len());
        all_truncations_fail(&bytes, |b| FetchResult::decode(b, &l));

        let bytes = e.encode(Some((&SECRET, &REQ_MAC)));
        let (back, framing) = ErrorMessage::decode(&bytes, e.version).unwrap();
        prop_assert_eq!(&back, &e);
        prop_assert!(verify_response_mac(&SECRET, &REQ_MAC, framing.s(&bytes), &framing.mac));
        all_truncations_fail(&bytes, |b| ErrorMessage::decode(b, e.version));
        prop_assert_eq!(ErrorMessage::decode(&bytes, 1 - e.version).unwrap_err().code, ErrorCode::UnsupportedVersion);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in bytes(300)) {
        let l = Limits::default();
        let _ = Hello::decode(&b, &l);
        let _ = HelloOk::decode(&b);
        let _ = Save::decode(&b, &l);
        let _ = Fetch::decode(&b, &l);
        let _ = SaveResult::decode(&b, &l);
        let _ = FetchResult::decode(&b, &l);
        let _ = ErrorMessage::decode(&b, 1);
        let _ = Head::parse(&b, &HeadRules::default());
        let _ = ResponseHead::parse(&b, 65_536, 100);
        let _ = Cb::Delta(b.clone()).decode(b"reference bytes", "x", 1 << 16, ErrorCode::LimitExceeded);
    }

    #[test]
    fn bit_flips_of_the_vectors_never_panic(seed in any::<u64>(), flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..4)) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
        let vs = m["vectors"].as_array().unwrap();
        let v = &vs[(seed % vs.len() as u64) as usize];
        let mut b = std::fs::read(root.join(v["file"].as_str().unwrap())).unwrap();
        if b.len() > 70_000 { return Ok(()); }
        for (at, bit) in flips {
            let n = b.len();
            b[at % n] ^= 1 << bit;
        }
        let l = Limits::default();
        let rules = HeadRules::default();
        if let Ok((s, _)) = Save::decode(&b, &l) {
            let mut t = ContextTable::new();
            if resolve::apply_definitions(&mut t, &s.ctx_defs, &l, &rules).is_ok() {
                let _ = resolve::resolve_save(&s, &t, &l, &rules);
            }
        }
        if let Ok((f, _)) = Fetch::decode(&b, &l) {
            let mut t = ContextTable::new();
            if resolve::apply_definitions(&mut t, &f.ctx_defs, &l, &rules).is_ok() {
                let _ = resolve::resolve_fetch(&f, &t, &l, &rules);
            }
        }
        let _ = SaveResult::decode(&b, &l);
        let _ = FetchResult::decode(&b, &l);
        let _ = ErrorMessage::decode(&b, 1);
        let _ = Hello::decode(&b, &l);
    }
}

#[test]
fn every_truncation_of_every_valid_vector_is_an_error() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    let l = Limits::default();
    for v in m["vectors"].as_array().unwrap().iter().filter(|v| v["expect"]["ok"] == true) {
        let b = std::fs::read(root.join(v["file"].as_str().unwrap())).unwrap();
        let kind = v.get("path").unwrap_or(&v["message"]).as_str().unwrap();
        for n in 0..b.len() {
            let cut = &b[..n];
            let failed = match kind {
                PATH_HELLO => Hello::decode(cut, &l).is_err(),
                PATH_FETCH => Fetch::decode(cut, &l).is_err(),
                PATH_SAVE => Save::decode(cut, &l).and_then(|(s, f)| s.split_payloads(&cut[f.payload_offset..])).is_err(),
                "HELLO_OK" => HelloOk::decode(cut).is_err(),
                "SAVE_RESULT" => SaveResult::decode(cut, &l).is_err(),
                "FETCH_RESULT" => FetchResult::decode(cut, &l).and_then(|(r, f)| r.payload(&cut[f.payload_offset..]).map(|_| ())).is_err(),
                "ERROR" => ErrorMessage::decode(cut, v["state"]["version"].as_u64().unwrap() as u8).is_err(),
                k => panic!("{k}"),
            };
            assert!(failed, "{} cut to {n} bytes decoded", v["name"]);
        }
    }
}
