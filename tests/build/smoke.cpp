// Build smoke test: the umbrella header compiles, fusebox::fusebox brings its dependencies
// (xsimd, Boost.Hana, threads) to the consumer, and version.hpp agrees with CMakeLists.txt.
#include <fusebox/fusebox.hpp>
#include <fusebox/version.hpp>

#include <boost/hana.hpp>
#include <catch2/catch.hpp>
#include <xsimd/xsimd.hpp>

#include <array>
#include <string>
#include <thread>

TEST_CASE("version.hpp matches project(VERSION) in CMakeLists.txt") {
    // FUSEBOX_PROJECT_VERSION is ${PROJECT_VERSION}, passed by tests/CMakeLists.txt.
    CHECK(std::string(fusebox::version_string) == FUSEBOX_PROJECT_VERSION);
    const std::string from_parts = std::to_string(fusebox::version_major) + "." +
                                   std::to_string(fusebox::version_minor) + "." +
                                   std::to_string(fusebox::version_patch);
    CHECK(from_parts == FUSEBOX_PROJECT_VERSION);
}

TEST_CASE("fusebox::fusebox carries xsimd, Hana and threads") {
    // xsimd: a batch of floats is at least one lane and adds lane-wise.
    using batch = xsimd::batch<float>;
    STATIC_REQUIRE(batch::size >= 1);
    const batch sum = batch(1.5f) + batch(2.0f);
    std::array<float, batch::size> lanes{};
    sum.store_unaligned(lanes.data());
    for (float lane : lanes) CHECK(lane == 3.5f);

    // Hana: type-level computation works.
    constexpr auto types = boost::hana::tuple_t<int, float, double>;
    STATIC_REQUIRE(boost::hana::length(types) == boost::hana::size_c<3>);

    // Threads: a thread starts and joins (the link needs Threads::Threads on some toolchains).
    int seen = 0;
    std::thread worker([&seen] { seen = 42; });
    worker.join();
    CHECK(seen == 42);
}
