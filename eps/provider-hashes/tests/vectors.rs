//! Test vectors for every provider hash. The Dropbox and QuickXorHash
//! vectors are rclone's (`backend/dropbox/dbhash/dbhash_test.go`,
//! `backend/onedrive/quickxorhash/quickxorhash_test.go`); the MD5, SHA-1
//! and Adler-32 ones are the RFC 1321 / FIPS 180 examples and the
//! Wikipedia "Wikipedia" Adler-32 example.

use base64::Engine as _;
use ec_provider_hashes::*;

fn b64(text: &str) -> Vec<u8> {
    let joined: String = text.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD.decode(joined).unwrap()
}

/// rclone dbhash_test.go: `n` bytes of 'A'.
const DROPBOX_A_VECTORS: &[(usize, &str)] = &[
    (0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (1, "1cd6ef71e6e0ff46ad2609d403dc3fee244417089aa4461245a4e4fe23a55e42"),
    (2, "01e0655fb754d10418a73760f57515f4903b298e6d67dda6bf0987fa79c22c88"),
    (4096, "8620913d33852befe09f16fff8fd75f77a83160d29f76f07e0276e9690903035"),
    (4194303, "647c8627d70f7a7d13ce96b1e7710a771a55d41a62c3da490d92e56044d311fa"),
    (4194304, "d4d63bac5b866c71620185392a8a6218ac1092454a2d16f820363b69852befa3"),
    (4194305, "8f553da8d00d0bf509d8470e242888be33019c20c0544811f5b2b89e98360b92"),
    (8388607, "83b30cf4fb5195b04a937727ae379cf3d06673bf8f77947f6a92858536e8369c"),
    (8388608, "e08b3ba1f538804075c5f939accdeaa9efc7b5c01865c94a41e78ca6550a88e7"),
    (8388609, "02c8a4aefc2bfc9036f89a7098001865885938ca580e5c9e5db672385edd303c"),
];

#[test]
fn dropbox_one_shot_matches_rclone_vectors() {
    let data = vec![b'A'; 8388609];
    for &(n, want) in DROPBOX_A_VECTORS {
        assert_eq!(dropbox_content_hash(&data[..n]), want, "length {n}");
    }
}

/// rclone feeds the input in chunks of several sizes, some not dividing
/// the 4 MiB block (2047) and some larger than it (8 MiB, 16 MiB).
#[test]
fn dropbox_streaming_in_chunks_matches_rclone_vectors() {
    let data = vec![b'A'; 8388609];
    for chunk in [16 << 20, 8 << 20, 4 << 20, 1 << 20, 65536, 2048, 2047, 4194303, 4194305] {
        for &(n, want) in DROPBOX_A_VECTORS {
            let mut hasher = DropboxContentHasher::new();
            for piece in data[..n].chunks(chunk) {
                hasher.update(piece);
            }
            assert_eq!(hasher.finalize_hex(), want, "length {n} chunk {chunk}");
        }
    }
}

#[test]
fn dropbox_is_sha256_of_block_digests() {
    use sha2::{Digest, Sha256};
    let data: Vec<u8> = (0..(2 * DROPBOX_BLOCK_SIZE + 17)).map(|i| (i * 7 % 251) as u8).collect();
    let mut overall = Sha256::new();
    for block in data.chunks(DROPBOX_BLOCK_SIZE) {
        overall.update(Sha256::digest(block));
    }
    assert_eq!(dropbox_content_hash(&data), hex::encode(overall.finalize()));
}

#[test]
fn dropbox_empty_updates_change_nothing() {
    let mut hasher = DropboxContentHasher::new();
    hasher.update(b"");
    hasher.update(b"A");
    hasher.update(b"");
    assert_eq!(hasher.finalize_hex(), "1cd6ef71e6e0ff46ad2609d403dc3fee244417089aa4461245a4e4fe23a55e42");
}

/// rclone quickxorhash_test.go: (size, input base64, hash base64).
const QUICKXOR_VECTORS: &[(usize, &str, &str)] = &[
    (0, "", "AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    (1, "Sg==", "SgAAAAAAAAAAAAAAAQAAAAAAAAA="),
    (2, "tbQ=", "taAFAAAAAAAAAAAAAgAAAAAAAAA="),
    (3, "0pZP", "0rDEEwAAAAAAAAAAAwAAAAAAAAA="),
    (4, "jRRDVA==", "jaDAEKgAAAAAAAAABAAAAAAAAAA="),
    (5, "eAV52qE=", "eChAHrQRCgAAAAAABQAAAAAAAAA="),
    (6, "luBZlaT6", "lgBHFipBCn0AAAAABgAAAAAAAAA="),
    (7, "qaApEj66lw==", "qQBFCiTgA11cAgAABwAAAAAAAAA="),
    (8, "/aNzzCFPS/A=", "/RjFHJgRgicsAR4ACAAAAAAAAAA="),
    (9, "n6Neh7p6fFgm", "nxiFFw6hCz3wAQsmCQAAAAAAAAA="),
    (10, "J9iPGCbfZSTNyw==", "J8DGIzBggm+UgQTNUgYAAAAAAAA="),
    (11, "i+UZyUGJKh+ISbk=", "iyhHBpIRhESo4AOIQ0IuAAAAAAA="),
    (12, "h490d57Pqz5q2rtT", "h3gEHe7giWeswgdq3MYupgAAAAA="),
    (13, "vPgoDjOfO6fm71RxLw==", "vMAHChwwg0/s4BTmdQcV4vACAAA="),
    (14, "XoJ1AsoR4fDYJrDqYs4=", "XhBEHQSgjAiEAx7YPgEs1CEGZwA="),
    (15, "gQaybEqS/4UlDc8e4IJm", "gDCALNigBEn8oxAlZ8AzPAAOQZg="),
    (16, "2fuxhBJXtpWFe8dOfdGeHw==", "O9tHLAghgSvYohKFyMMxnNCHaHg="),
    (17, "XBV6YKU9V7yMakZnFIxIkuU=", "HbplHsBQih5cgReMQYMRzkABRiA="),
    (18, "XJZSOiNO2bmfKnTKD7fztcQX", "/6ZArHQwAidkIxefQgEdlPGAW8w="),
    (19, "g8VtAh+2Kf4k0kY5tzji2i2zmA==", "wDNrgwHWAVukwB8kg4YRcnALHIg="),
    (20, "T6LYJIfDh81JrAK309H2JMJTXis=", "zBTHrspn3mEcohlJdIUAbjGNaNg="),
    (21, "DWAAX5/CIfrmErgZa8ot6ZraeSbu", "LR2Z0PjuRYGKQB/mhQAuMrAGZbQ="),
    (22, "N9abi3qy/mC1THZuVLHPpx7SgwtLOA==", "1KTYttCBEen8Hwy1doId3ECFWDw="),
    (23, "LlUe7wHerLqEtbSZLZgZa9u0m7hbiFs=", "TqVZpxs3cN61BnuFvwUtMtECTGQ="),
    (24, "bU2j/0XYdgfPFD4691jV0AOUEUPR4Z5E", "bnLBiLpVgnxVkXhNsIAPdHAPLFQ="),
    (25, "lScPwPsyUsH2T1Qsr31wXtP55Wqbe47Uyg==", "VDMSy8eI26nBHCB0e8gVWPCKPsA="),
    (26, "rJaKh1dLR1k+4hynliTZMGf8Nd4qKKoZiAM=", "r7bjwkl8OYQeNaMcCY8fTmEJEmQ="),
    (27, "pPsT0CPmHrd3Frsnva1pB/z1ytARLeHEYRCo", "Rdg7rCcDomL59pL0s6GuTvqLVqQ="),
    (28, "wSRChaqmrsnMrfB2yqI43eRWbro+f9kBvh+01w==", "YTtloIi6frI7HX3vdLvE7I2iUOA="),
    (29, "apL67KMIRxQeE9k1/RuW09ppPjbF1WeQpTjSWtI=", "CIpedls+ZlSQ654fl+X26+Q7LVU="),
    (30, "53yx0/QgMTVb7OOzHRHbkS7ghyRc+sIXxi7XHKgT", "zfJtLGFgR9DB3Q64fAFIp+S5iOY="),
    (31, "PwXNnutoLLmxD8TTog52k8cQkukmT87TTnDipKLHQw==", "PTaGs7yV3FUyBy/SfU6xJRlCJlI="),
    (32, "NbYXsp5/K6mR+NmHwExjvWeWDJFnXTKWVlzYHoesp2E=", "wjuAuWDiq04qDt1R8hHWDDcwVoQ="),
    (33, "qQ70RB++JAR5ljNv3lJt1PpqETPsckopfonItu18Cr3E", "FkJaeg/0Z5+euShYlLpE2tJh+Lo="),
    (34, "RhzSatQTQ9/RFvpHyQa1WLdkr3nIk6MjJUma998YRtp44A==", "SPN2D29reImAqJezlqV2DLbi8tk="),
    (35, "DND1u1uZ5SqZVpRUk6NxSUdVo7IjjL9zs4A1evDNCDLcXWc=", "S6lBk2hxI2SWBfn7nbEl7D19UUs="),
    (36, "jEi62utFz69JMYHjg1iXy7oO6ZpZSLcVd2B+pjm6BGsv/CWi", "s0lYU9tr/bp9xsnrrjYgRS5EvV8="),
    (37, "hfS3DZZnhy0hv7nJdXLv/oJOtIgAuP9SInt/v8KeuO4/IvVh4A==", "CV+HQCdd2A/e/vdi12f2UU55GLA="),
    (38, "EkPQAC6ymuRrYjIXD/LT/4Vb+7aTjYVZOHzC8GPCEtYDP0+T3Nc=", "kE9H9sEmr3vHBYUiPbvsrcDgSEo="),
    (39, "vtBOGIENG7yQ/N7xNWPNIgy66Gk/I2Ur/ZhdFNUK9/1FCZuu/KeS", "+Fgp3HBimtCzUAyiinj3pkarYTk="),
    (40, "YnF4smoy9hox2jBlJ3VUa4qyCRhOZbWcmFGIiszTT4zAdYHsqJazyg==", "arkIn+ELddmE8N34J9ydyFKW+9w="),
    (41, "0n7nl3YJtipy6yeUbVPWtc2h45WbF9u8hTz5tNwj3dZZwfXWkk+GN3g=", "YJLNK7JR64j9aODWfqDvEe/u6NU="),
    (42, "FnIIPHayc1pHkY4Lh8+zhWwG8xk6Knk/D3cZU1/fOUmRAoJ6CeztvMOL", "22RPOylMtdk7xO/QEQiMli4ql0k="),
    (43, "J82VT7ND0Eg1MorSfJMUhn+qocF7PsUpdQAMrDiHJ2JcPZAHZ2nyuwjoKg==", "pOR5eYfwCLRJbJsidpc1rIJYwtM="),
    (44, "Zbu+78+e35ZIymV5KTDdub5McyI3FEO8fDxs62uWHQ9U3Oh3ZqgaZ30SnmQ=", "DbvbTkgNTgWRqRidA9r1jhtUjro="),
    (45, "lgybK3Da7LEeY5aeeNrqcdHvv6mD1W4cuQ3/rUj2C/CNcSI0cAMw6vtpVY3y", "700RQByn1lRQSSme9npQB/Ye+bY="),
    (46, "jStZgKHv4QyJLvF2bYbIUZi/FscHALfKHAssTXkrV1byVR9eACwW9DNZQRHQwg==", "uwN55He8xgE4g93dH9163xPew4U="),
    (47, "V1PSud3giF5WW72JB/bgtltsWtEB5V+a+wUALOJOGuqztzVXUZYrvoP3XV++gM0=", "U+3ZfUF/6mwOoHJcSHkQkckfTDA="),
    (48, "VXs4t4tfXGiWAL6dlhEMm0YQF0f2w9rzX0CvIVeuW56o6/ec2auMpKeU2VeteEK5", "sq24lSf7wXLH8eigHl07X+qPTps="),
    (49, "bLUn3jLH+HFUsG3ptWTHgNvtr3eEv9lfKBf0jm6uhpqhRwtbEQ7Ovj/hYQf42zfdtQ==", "uC8xrnopGiHebGuwgq607WRQyxQ="),
    (50, "4SVmjtXIL8BB8SfkbR5Cpaljm2jpyUfAhIBf65XmKxHlz9dy5XixgiE/q1lv+esZW/E=", "wxZ0rxkMQEnRNAp8ZgEZLT4RdLM="),
    (51, "pMljctlXeFUqbG3BppyiNbojQO3ygg6nZPeUZaQcVyJ+Clgiw3Q8ntLe8+02ZSfyCc39", "aZEPmNvOXnTt7z7wt+ewV7QGMlg="),
    (52, "C16uQlxsHxMWnV2gJhFPuJ2/guZ4N1YgmNvAwL1yrouGQtwieGx8WvZsmYRnX72JnbVtTw==", "QtlSNqXhVij64MMhKJ3EsDFB/z8="),
    (53, "7ZVDOywvrl3L0GyKjjcNg2CcTI81n2CeUbzdYWcZOSCEnA/xrNHpiK01HOcGh3BbxuS4S6g=", "4NznNJc4nmXeApfiCFTq/H5LbHw="),
    (54, "JXm2tTVqpYuuz2Cc+ZnPusUb8vccPGrzWK2oVwLLl/FjpFoxO9FxGlhnB08iu8Q/XQSdzHn+", "IwE5+2pKNcK366I2k2BzZYPibSI="),
    (55, "TiiU1mxzYBSGZuE+TX0l9USWBilQ7dEml5lLrzNPh75xmhjIK8SGqVAkvIMgAmcMB+raXdMPZg==", "yECGHtgR128ScP4XlvF96eLbIBE="),
    (56, "zz+Q4zi6wh0fCJUFU9yUOqEVxlIA93gybXHOtXIPwQQ44pW4fyh6BRgc1bOneRuSWp85hwlTJl8=", "+3Ef4D6yuoC8J+rbFqU1cegverE="),
    (57, "sa6SHK9z/G505bysK5KgRO2z2cTksDkLoFc7sv0tWBmf2G2mCiozf2Ce6EIO+W1fRsrrtn/eeOAV", "xZg1CwMNAjN0AIXw2yh4+1N3oos="),
    (
        58,
        "0qx0xdyTHhnKJ22IeTlAjRpWw6y2sOOWFP75XJ7cleGJQiV2kyrmQOST4DGHIL0qqA7sMOdzKyTV
          iw==",
        "bS0tRYPkP1Gfc+ZsBm9PMzPunG8=",
    ),
    (
        59,
        "QuzaF0+5ooig6OLEWeibZUENl8EaiXAQvK9UjBEauMeuFFDCtNcGs25BDtJGGbX90gH4VZvCCDNC
          q4s=",
        "rggokuJq1OGNOfB6aDp2g4rdPgw=",
    ),
    (
        60,
        "+wg2x23GZQmMLkdv9MeAdettIWDmyK6Wr+ba23XD+Pvvq1lIMn9QIQT4Z7QHJE3iC/ZMFgaId9VA
          yY3d",
        "ahQbTmOdiKUNdhYRHgv5/Ky+Y6k=",
    ),
    (
        61,
        "y0ydRgreRQwP95vpNP92ioI+7wFiyldHRbr1SfoPNdbKGFA0lBREaBEGNhf9yixmfE+Azo2AuROx
          b7Yc7g==",
        "cJKFc0dXfiN4hMg1lcMf5E4gqvo=",
    ),
    (
        62,
        "LxlVvGXSQlSubK8r0pGf9zf7s/3RHe75a2WlSXQf3gZFR/BtRnR7fCIcaG//CbGfodBFp06DBx/S
          9hUV8Bk=",
        "NwuwhhRWX8QZ/vhWKWgQ1+rNomI=",
    ),
    (
        63,
        "L+LSB8kmGMnHaWVA5P/+qFnfQliXvgJW7d2JGAgT6+koi5NQujFW1bwQVoXrBVyob/gBxGizUoJM
          gid5gGNo",
        "ndX/KZBtFoeO3xKeo1ajO/Jy+rY=",
    ),
    (
        64,
        "Mb7EGva2rEE5fENDL85P+BsapHEEjv2/siVhKjvAQe02feExVOQSkfmuYzU/kTF1MaKjPmKF/w+c
          bvwfdWL8aQ==",
        "n1anP5NfvD4XDYWIeRPW3ZkPv1Y=",
    ),
    (
        111,
        "jyibxJSzO6ZiZ0O1qe3tG/bvIAYssvukh9suIT5wEy1JBINVgPiqdsTW0cOpP0aUfP7mgqLfADkz
           I/m/GgCuVhr8oFLrOCoTx1/psBOWwhltCbhUx51Icm9aH8tY4Z3ccU+6BKpYQkLCy0B/A9Zc",
        "hZfLIilSITC6N3e3tQ/iSgEzkto=",
    ),
    (
        128,
        "ikwCorI7PKWz17EI50jZCGbV9JU2E8bXVfxNMg5zdmqSZ2NlsQPp0kqYIPjzwTg1MBtfWPg53k0h
           0P2naJNEVgrqpoHTfV2b3pJ4m0zYPTJmUX4Bg/lOxcnCxAYKU29Y5F0U8Quz7ZXFBEweftXxJ7RS
           4r6N7BzJrPsLhY7hgck=",
        "imAoFvCWlDn4yVw3/oq1PDbbm6U=",
    ),
    (
        222,
        "PfxMcUd0vIW6VbHG/uj/Y0W6qEoKmyBD0nYebEKazKaKG+UaDqBEcmQjbfQeVnVLuodMoPp7P7TR
           1htX5n2VnkHh22xDyoJ8C/ZQKiSNqQfXvh83judf4RVr9exJCud8Uvgip6aVZTaPrJHVjQhMCp/d
           EnGvqg0oN5OVkM2qqAXvA0teKUDhgNM71sDBVBCGXxNOR2bpbD1iM4dnuT0ey4L+loXEHTL0fqMe
           UcEi2asgImnlNakwenDzz0x57aBwyq3AspCFGB1ncX4yYCr/OaCcS5OKi/00WH+wNQU3",
        "QX/YEpG0gDsmhEpCdWhsxDzsfVE=",
    ),
    (
        256,
        "qwGf2ESubE5jOUHHyc94ORczFYYbc2OmEzo+hBIyzJiNwAzC8PvJqtTzwkWkSslgHFGWQZR2BV5+
           uYTrYT7HVwRM40vqfj0dBgeDENyTenIOL1LHkjtDKoXEnQ0mXAHoJ8PjbNC93zi5TovVRXTNzfGE
           s5dpWVqxUzb5lc7dwkyvOluBw482mQ4xrzYyIY1t+//OrNi1ObGXuUw2jBQOFfJVj2Y6BOyYmfB1
           y36eBxi3zxeG5d5NYjm2GSh6e08QMAwu3zrINcqIzLOuNIiGXBtl7DjKt7b5wqi4oFiRpZsCyx2s
           mhSrdrtK/CkdU6nDN+34vSR/M8rZpWQdBE7a8g==",
        "WYT9JY3JIo/pEBp+tIM6Gt2nyTM=",
    ),
    (
        333,
        "w0LGhqU1WXFbdavqDE4kAjEzWLGGzmTNikzqnsiXHx2KRReKVTxkv27u3UcEz9+lbMvYl4xFf2Z4
           aE1xRBBNd1Ke5C0zToSaYw5o4B/7X99nKK2/XaUX1byLow2aju2XJl2OpKpJg+tSJ2fmjIJTkfuY
           Uz574dFX6/VXxSxwGH/xQEAKS5TCsBK3CwnuG1p5SAsQq3gGVozDWyjEBcWDMdy8/AIFrj/y03Lf
           c/RNRCQTAfZbnf2QwV7sluw4fH3XJr07UoD0YqN+7XZzidtrwqMY26fpLZnyZjnBEt1FAZWO7RnK
           G5asg8xRk9YaDdedXdQSJAOy6bWEWlABj+tVAigBxavaluUH8LOj+yfCFldJjNLdi90fVHkUD/m4
           Mr5OtmupNMXPwuG3EQlqWUVpQoYpUYKLsk7a5Mvg6UFkiH596y5IbJEVCI1Kb3D1",
        "e3+wo77iKcILiZegnzyUNcjCdoQ=",
    ),
];

#[test]
fn quick_xor_one_shot_matches_rclone_vectors() {
    for &(size, input, want) in QUICKXOR_VECTORS {
        let input = b64(input);
        assert_eq!(input.len(), size, "vector {size} transcribed wrongly");
        assert_eq!(quick_xor_hash(&input), want, "size {size}");
    }
}

#[test]
fn quick_xor_streaming_by_block_matches_rclone_vectors() {
    for block in [1, 2, 4, 7, 8, 16, 32, 64, 128, 159, 160, 161, 256, 512] {
        for &(size, input, want) in QUICKXOR_VECTORS {
            let input = b64(input);
            let mut hasher = QuickXorHasher::new();
            for piece in input.chunks(block) {
                hasher.update(piece);
            }
            assert_eq!(hasher.finalize_base64(), want, "size {size} block {block}");
        }
    }
}

/// The folded implementation against a direct transcription of
/// Microsoft's description (a 160-bit integer, each byte shifted in at
/// 11 bits more than the previous one), on inputs long enough for the
/// shift pattern to wrap many times and for the length to exceed a byte.
#[test]
fn quick_xor_matches_naive_definition_on_long_input() {
    fn naive(data: &[u8]) -> [u8; 20] {
        let mut bits = [false; 160];
        for (i, &byte) in data.iter().enumerate() {
            for bit in 0..8 {
                if byte >> bit & 1 == 1 {
                    let at = (i * 11 + bit) % 160;
                    bits[at] = !bits[at];
                }
            }
        }
        let mut out = [0u8; 20];
        for (at, &set) in bits.iter().enumerate() {
            if set {
                out[at / 8] |= 1 << (at % 8);
            }
        }
        for (slot, byte) in out[12..].iter_mut().zip((data.len() as u64).to_le_bytes()) {
            *slot ^= byte;
        }
        out
    }
    for len in [159usize, 160, 161, 1000, 70_001] {
        let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
        let mut hasher = QuickXorHasher::new();
        for piece in data.chunks(333) {
            hasher.update(piece);
        }
        assert_eq!(hasher.finalize(), naive(&data), "length {len}");
    }
}

#[test]
fn md5_known_answers() {
    assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
    assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
    let mut hasher = Md5Hasher::new();
    for piece in b"message digest".chunks(3) {
        hasher.update(piece);
    }
    assert_eq!(hasher.finalize_hex(), "f96b697d7cb7938d525a2f31aaf161d0");
}

#[test]
fn oc_checksum_computes_each_algorithm() {
    assert_eq!(OcChecksum::compute(OcAlgorithm::Sha1, b"abc").to_string(), "SHA1:a9993e364706816aba3e25717850c26c9cd0d89d");
    assert_eq!(OcChecksum::compute(OcAlgorithm::Md5, b"abc").to_string(), "MD5:900150983cd24fb0d6963f7d28e17f72");
    assert_eq!(OcChecksum::compute(OcAlgorithm::Adler32, b"Wikipedia").to_string(), "ADLER32:11e60398");
    // Adler-32 of nothing is 1: written with leading zeros.
    assert_eq!(OcChecksum::compute(OcAlgorithm::Adler32, b"").to_string(), "ADLER32:00000001");
}

#[test]
fn oc_checksum_parses_and_checks_bodies() {
    let value: OcChecksum = "SHA1:A9993E364706816ABA3E25717850C26C9CD0D89D".parse().unwrap();
    assert_eq!(value.algorithm(), OcAlgorithm::Sha1);
    assert!(value.matches(b"abc"));
    assert!(!value.matches(b"abd"));

    let value = OcChecksum::parse(" md5:900150983cd24fb0d6963f7d28e17f72 ").unwrap();
    assert!(value.matches(b"abc"));

    // The ownCloud desktop client writes Adler-32 without leading zeros.
    let short = OcChecksum::parse("ADLER32:1").unwrap();
    assert!(short.matches(b""));
    assert_eq!(short.to_string(), "ADLER32:00000001");
    assert!(OcChecksum::parse("adler32:11E60398").unwrap().matches(b"Wikipedia"));

    let mut hasher = OcHasher::new(OcAlgorithm::Adler32);
    hasher.update(b"Wiki");
    hasher.update(b"pedia");
    assert_eq!(hasher.finalize(), OcChecksum::parse("ADLER32:11e60398").unwrap());
}

#[test]
fn oc_checksum_rejects_malformed_values() {
    assert!(matches!(OcChecksum::parse("a9993e364706816aba3e25717850c26c9cd0d89d"), Err(OcChecksumError::MissingSeparator { .. })));
    assert!(matches!(
        OcChecksum::parse("SHA256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        Err(OcChecksumError::UnsupportedAlgorithm { algorithm }) if algorithm == "SHA256"
    ));
    for bad in ["SHA1:a9993e", "SHA1:zz993e364706816aba3e25717850c26c9cd0d89d", "MD5:", "ADLER32:", "ADLER32:123456789", "ADLER32:xyz"] {
        let err = OcChecksum::parse(bad).unwrap_err();
        assert!(matches!(err, OcChecksumError::BadDigest { .. }), "{bad}: {err}");
        assert!(err.to_string().contains("hex digits"), "{err}");
    }
}
