// Package fixes lists the in-tree fix modules. Adding a fix is one line here.
package fixes

import (
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/fixes/conntrackcapacity"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackliberal"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
	"github.com/network-node-manager/network-node-manager/fixes/mssclamp"
	"github.com/network-node-manager/network-node-manager/fixes/neighbourtable"
	"github.com/network-node-manager/network-node-manager/fixes/nodeportreservedports"
	"github.com/network-node-manager/network-node-manager/fixes/staleudpconntrack"
)

// Modules are the in-tree fixes' modules, one per fix.
var Modules = []fx.Option{
	invaliddrop.Module,
	ipvsexternalipdnat.Module,
	conntrackliberal.Module,
	mssclamp.Module,
	staleudpconntrack.Module,
	conntrackcapacity.Module,
	neighbourtable.Module,
	nodeportreservedports.Module,
}

// Standard is every in-tree fix.
var Standard = fx.Options(Modules...)
