"""Conan 2 recipe for fusebox, a header-only C++20 model compiler.

The recipe lives in conan/ and the sources one directory up, so export_sources() copies them
explicitly. Packaging runs the project's own CMake install rules (one definition of what is
installed); the CMake config files that install writes are then dropped, because Conan
consumers get fusebox::fusebox from CMakeDeps, configured by package_info() below.

    conan create conan/ --build=missing
"""

import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir

required_conan_version = ">=2.0"


class FuseboxConan(ConanFile):
    name = "fusebox"
    description = ("Header-only C++20 model compiler: capture a model as an expression type, "
                   "fuse it into kernels, run it on the CPU (xsimd) or an NVIDIA GPU")
    topics = ("deep-learning", "compiler", "tensor", "simd", "jit", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True
    # Only Boost.Hana is used, and it is header-only.
    default_options = {"boost/*:header_only": True}

    def set_version(self):
        # One source of truth for the version: project(fusebox VERSION x.y.z) in CMakeLists.txt.
        cmakelists = load(self, os.path.join(self.recipe_folder, "..", "CMakeLists.txt"))
        match = re.search(r"project\(\s*fusebox\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", cmakelists)
        if not match:
            raise ValueError("conanfile.py: no 'project(fusebox VERSION x.y.z' in CMakeLists.txt")
        self.version = self.version or match.group(1)

    def export_sources(self):
        # Equivalent of exports_sources = "include/*", "cmake/*", "CMakeLists.txt", taken from
        # the repository root rather than from conan/.
        root = os.path.join(self.recipe_folder, "..")
        dst = self.export_sources_folder
        copy(self, "CMakeLists.txt", src=root, dst=dst)
        copy(self, "LICENSE*", src=root, dst=dst)
        copy(self, "*", src=os.path.join(root, "include"), dst=os.path.join(dst, "include"))
        copy(self, "*", src=os.path.join(root, "cmake"), dst=os.path.join(dst, "cmake"))

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Consumers include fusebox headers, which include these: their headers must be visible
        # to the consumer too (transitive_headers).
        self.requires("xsimd/[>=8 <9]", transitive_headers=True)
        self.requires("boost/[>=1.74]", transitive_headers=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def generate(self):
        tc = CMakeToolchain(self)
        # Packaging needs only the install rules.
        tc.cache_variables["FUSEBOX_BUILD_TESTS"] = False
        tc.cache_variables["FUSEBOX_BUILD_BENCH"] = False
        tc.cache_variables["FUSEBOX_BUILD_EXAMPLES"] = False
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        # Nothing to compile; configuring checks that xsimd and the Hana headers resolve.
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE*", src=self.source_folder,
             dst=os.path.join(self.package_folder, "licenses"))
        cmake = CMake(self)
        cmake.install()
        # CMakeDeps writes the consumer-side config from package_info(); ours would compete.
        rmdir(self, os.path.join(self.package_folder, "share"))
        rmdir(self, os.path.join(self.package_folder, "lib"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "fusebox")
        self.cpp_info.set_property("cmake_target_name", "fusebox::fusebox")
        self.cpp_info.requires = ["xsimd::xsimd", "boost::headers"]
        if self.settings.os in ("Linux", "FreeBSD"):
            # Threads for the CPU thread pool, dl for run-time loading of CUDA and JIT kernels.
            self.cpp_info.system_libs = ["pthread", "dl"]
