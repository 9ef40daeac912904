{
  description = "cowboy: Redis Streams message bridges between AI agents and the world, with human approval";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      packages = forAll (pkgs: {
        default = pkgs.rustPlatform.buildRustPackage {
          pname = "cowboy";
          version = "0.1.0";
          src = ./..;
          cargoLock.lockFile = ../Cargo.lock;
          # The test suite needs redis-server, Postfix and Dovecot: run it with .ci/run.
          doCheck = false;
          meta.mainProgram = "cowboy";
        };
      });

      nixosModules.default = { pkgs, lib, ... }: {
        imports = [ ./module.nix ];
        services.cowboy.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
      };

      checks = forAll (pkgs: {
        vm = pkgs.testers.runNixOSTest (import ./tests/cowboy.nix { inherit self; });
      });
    };
}
