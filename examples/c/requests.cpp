// The C++ wrapper of the many-requests engine (hetsched::Requests in hetsched.hpp): a
// background request streamed through a lambda while an interactive one is generated
// with the blocking generate(), a request whose token callback throws (the wrapper
// cancels it: no exception reaches the library), and bad input thrown as
// hetsched::Error. The destructor closes the engine; no handle is left alive.
//
//   requests_cpp MODEL.gguf
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>

#include "hetsched.hpp"

namespace {
int failures = 0;

void expect(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "expectation failed: %s\n", what);
        failures++;
    }
}

/// The status a call throws, or HS_OK when it does not throw.
template <typename Call> hs_status thrown_status(Call call) {
    try {
        call();
    } catch (const hetsched::Error &e) {
        std::printf("throws as expected: %s\n", e.what());
        return e.status();
    }
    return HS_OK;
}
} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    // What the callbacks write to outlives the engine: its destructor delivers the
    // last callbacks of requests still live.
    std::string background_text;
    std::promise<hetsched::RequestEnd> background_end, thrown_end;
    try {
        // Two compute threads; 8-token prefill chunks, the preemption granularity.
        hs_requests_limits limits{};
        limits.max_requests = 8;
        limits.threads = 2;
        limits.chunk_len = 8;
        hetsched::Requests engine(argv[1], limits);

        // Background, streamed: the callbacks run on the library's event thread, one
        // at a time, so `text` needs no lock; the promise hands the end to this thread.
        hetsched::RequestOptions background;
        background.max_tokens = 24;
        background.priority = HS_PRIORITY_BACKGROUND;
        engine.submit(
            "Once upon a time, in a small village by the sea, there lived an old fisherman "
            "who every morning",
            background,
            [&](std::uint64_t, std::uint32_t, std::string_view piece) {
                background_text.append(piece);
            },
            [&](std::uint64_t, const hetsched::RequestEnd &end) { background_end.set_value(end); });

        // Interactive, blocking: submitted while the background one runs.
        hetsched::RequestOptions interactive;
        interactive.max_tokens = 12;
        hetsched::Generated answer = engine.generate("The capital of France is", interactive);
        std::printf("[interactive] %s: \"%s\"\n  %s\n", hs_status_name(answer.end.status),
                    answer.text().c_str(), answer.end.result_json.c_str());
        expect(answer.end.status == HS_OK, "the interactive request ends HS_OK");
        expect(answer.text().find("Paris") != std::string::npos, "the greedy answer names Paris");

        // Two greedy samples with a stop string: both end before it, with equal text.
        hetsched::RequestOptions sampled = interactive;
        sampled.n = 2;
        sampled.stop = {"French"};
        hetsched::Generated two = engine.generate("The capital of France is", sampled);
        std::printf("[2 samples, stop \"French\"] \"%s\" | \"%s\"\n  %s\n",
                    two.samples.at(0).c_str(), two.samples.at(1).c_str(),
                    two.end.result_json.c_str());
        std::size_t cut = answer.text().find("French");
        expect(cut != std::string::npos && two.samples.at(0) == answer.text().substr(0, cut) &&
                   two.samples.at(1) == two.samples.at(0),
               "both samples end before the stop string");
        expect(two.end.result_json.find("\"finish_reasons\":[\"stop\",\"stop\"]") !=
                   std::string::npos,
               "both samples end by the stop string");
        expect(answer.end.result_json.find("ttft_ms") != std::string::npos,
               "the result holds the metrics");

        // A token callback that throws: the wrapper catches it and cancels the request.
        hetsched::RequestOptions long_request;
        long_request.max_tokens = 200;
        engine.submit(
            "Count from one to one hundred:", long_request,
            [](std::uint64_t, std::uint32_t, std::string_view) {
                throw std::runtime_error("host gave up");
            },
            [&](std::uint64_t, const hetsched::RequestEnd &end) { thrown_end.set_value(end); });
        hetsched::RequestEnd ended = thrown_end.get_future().get();
        std::printf("[throwing callback] %s\n  %s\n", hs_status_name(ended.status),
                    ended.result_json.c_str());
        expect(ended.status == HS_ERR_CANCELLED, "a throwing callback cancels its request");

        hetsched::RequestEnd end = background_end.get_future().get();
        std::printf("[background] %s: \"%s\"\n", hs_status_name(end.status),
                    background_text.c_str());
        expect(end.status == HS_OK && !background_text.empty(),
               "the background request ends HS_OK with text");

        // Bad input: typed errors, nothing submitted.
        expect(thrown_status([&] { engine.submit("", interactive); }) == HS_ERR_INVALID_ARGUMENT,
               "an empty prompt is HS_ERR_INVALID_ARGUMENT");
        hetsched::RequestOptions no_tokens;
        no_tokens.max_tokens = 0;
        expect(thrown_status([&] { engine.submit("Hello", no_tokens); }) ==
                   HS_ERR_INVALID_ARGUMENT,
               "max_tokens 0 is HS_ERR_INVALID_ARGUMENT");
        hetsched::RequestOptions empty_stop;
        empty_stop.stop = {""};
        expect(thrown_status([&] { engine.submit("Hello", empty_stop); }) ==
                   HS_ERR_INVALID_ARGUMENT,
               "an empty stop string is HS_ERR_INVALID_ARGUMENT");
        expect(thrown_status([&] { engine.cancel(12345); }) == HS_ERR_UNKNOWN_REQUEST,
               "cancelling an unknown request is HS_ERR_UNKNOWN_REQUEST");
        std::printf("engine: %s\n", engine.metrics_json().c_str());
    } catch (const hetsched::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    expect(thrown_status([&] { hetsched::Requests missing("no/such/model.gguf"); }) == HS_ERR_LOAD,
           "a missing model is HS_ERR_LOAD");
    if (hs_live_handles() != 0) {
        std::fprintf(stderr, "%zu handles left alive\n", hs_live_handles());
        failures++;
    }
    if (failures) return 1;
    std::printf("requests_cpp: every expectation held\n");
    return 0;
}
