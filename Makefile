# mediaonce: make demo | make test | make lint | make lambda
#
# The emulators (LocalStack for S3, SQS and EventBridge, moto for DynamoDB; or the
# LocalStack container for all three where Docker runs) are installed and
# started by scripts/emulators.sh; MEDIAONCE_EMULATORS=native|docker|auto.

SHELL := /bin/bash
EMULATORS := scripts/emulators.sh
# The SDK reaches the emulators only through the standard AWS_* variables.
WITH_EMULATORS = eval "$$($(EMULATORS) env)" &&
# The tests run the pinned ffmpeg (imageio-ffmpeg's static 7.0.2, the build
# the SAM layer ships) unless MEDIAONCE_FFMPEG names another.
WITH_FFMPEG = export MEDIAONCE_FFMPEG="$${MEDIAONCE_FFMPEG:-$$($(EMULATORS) ffmpeg)}" &&

.PHONY: test demo lint lambda media-tools reference-tools emulators emulators-stop clean-emulators

## test: start the emulators (if they are not up), install the reference
## tools (libvips, ImageMagick, cjpeg, Node.js, Chromium and tests/js's
## locked packages) if missing, and run every test, every test binary even when one fails;
## the chaos soak (SOAK_UPLOADS, default 500) runs, then the template's
## serving check (CORS on LocalStack's S3, the optional distribution)
test: emulators reference-tools
	$(WITH_EMULATORS) $(WITH_FFMPEG) cargo test --workspace --no-fail-fast --all-targets -- --skip chaos_soak
	$(WITH_EMULATORS) cargo test --test soak -- --nocapture
	$(WITH_EMULATORS) "$$($(EMULATORS) python)" scripts/template_serving.py

## demo: a real pipeline on the emulators: upload, notify, claim, run, reuse
demo: emulators
	cargo build --bin mediaonce
	$(WITH_EMULATORS) "$$($(EMULATORS) python)" scripts/demo.py target/debug/mediaonce

## lint: formatting, clippy (with and without the testing feature), no
## import circle among the modules, and the SAM template
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --lib --bins -- -D warnings
	python3 scripts/module_cycles.py
	$(EMULATORS) install
	"$$($(EMULATORS) bin)/cfn-lint" template.yaml

## lambda: the bootstrap for provided.al2023 on arm64, as SAM builds it
lambda:
	$(EMULATORS) install
	PATH="$$($(EMULATORS) bin):$$PATH" cargo lambda build --release --arm64 --bin bootstrap

## media-tools: the pinned ffmpeg (from PyPI's imageio-ffmpeg, into the
## tools virtualenv; no root), which the tests make their clips with and
## hls-package runs
media-tools:
	@$(WITH_FFMPEG) echo "MEDIAONCE_FFMPEG=$$MEDIAONCE_FFMPEG" && "$$MEDIAONCE_FFMPEG" -hide_banner -version | head -1

## reference-tools: Debian's vipsthumbnail, ImageMagick and cjpeg, which the
## thumbnail's differential test (tests/thumbnail_vips.rs) runs against, and
## Node.js with tests/js's locked packages (tests/hls_iframes.rs)
reference-tools:
	@scripts/reference_tools.sh

emulators:
	@$(EMULATORS) status || $(EMULATORS) start

emulators-stop:
	$(EMULATORS) stop
